"""A recipe model (`resume_model:build`) that can be killed for real at a chosen step.

`RESUME_TEST_KILL=RANK:STEP` makes that rank SIGKILL itself during the
forward pass of its STEP-th training step (1-based), as a crash or an OOM
kill would, with no chance to save anything. `RESUME_TEST_HOLD=RANK:STEP`
makes it print "HOLDING" there and wait, for a test to take its host down
at a known step. Without either the layer is an identity. The rest is the
recipes' own MLP with Dropout.
"""

import os
import signal
import time

import keras
import tensorflow as tf

from hvdkeras.recipes.models import mlp

KILL_ENV = "RESUME_TEST_KILL"
HOLD_ENV = "RESUME_TEST_HOLD"


def _step_for_this_rank(variable: str) -> int:
    rank, _, step = os.environ.get(variable, "").partition(":")
    return int(step) if step and rank == os.environ.get("PMI_RANK", "0") else 0


class KillAtStep(keras.layers.Layer):
    """Identity; kills this process at the configured training step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.kill_at = _step_for_this_rank(KILL_ENV)
        self.hold_at = _step_for_this_rank(HOLD_ENV)
        self.steps = 0

    def _tick(self):
        self.steps += 1
        if self.steps == self.kill_at:
            print(f"KILLING rank at step {self.steps}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if self.steps == self.hold_at:
            print(f"HOLDING rank at step {self.steps}", flush=True)
            time.sleep(10 ** 6)
        return tf.constant(0.0)

    def call(self, x, training=None):
        if not training or not (self.kill_at or self.hold_at):
            return x
        tick = tf.ensure_shape(tf.py_function(self._tick, [], tf.float32), ())
        return x + tf.cast(tick, x.dtype)


def build(input_shape=(64,), num_classes=10, hidden=(32,), dropout=0.3):
    inner = mlp(input_shape, num_classes, hidden=hidden, dropout=dropout)
    return keras.Sequential([keras.Input(tuple(input_shape)), KillAtStep(), *inner.layers],
                            name="resume_mlp")

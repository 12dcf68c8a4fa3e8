"""Checks that turn silent hangs into clear errors at trace time.

Both run only while Python runs: when a train step is traced, or eagerly.

Note [distributed wrapper outside loss scaling]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A LossScaleOptimizer skips a step when *its own* gradients hold inf/NaN. Put
outside a distributed optimizer it would decide on each rank's local
gradients, so one rank could skip the gradient allreduce that the others
wait in. The distributed optimizer must be the outer one: then it reduces
first and the loss-scale decision is taken on identical gradients
everywhere. `DistributedOptimizer` adds the LossScaleOptimizer inside itself
under "mixed_float16" (training/optimizer.py), the optimizer checks the
nesting when built and applied (here), and every hvdkeras callback checks a
compiled model before its first step (callbacks/_prepare.py).

What may import this module: the rest of `hvdkeras.training`.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import keras

from hvdkeras import compat

NESTING_MESSAGE = (
    "hvdkeras.DistributedOptimizer is wrapped inside a LossScaleOptimizer. The loss-scale "
    "optimizer checks this rank's own gradients for inf/NaN and skips the step on its own, "
    "so one rank could skip the gradient allreduce while the others wait in it. Put the "
    "distributed optimizer outside: set the 'mixed_float16' policy before calling "
    "hvdkeras.DistributedOptimizer (it then adds the LossScaleOptimizer inside itself and "
    "compile() leaves it alone), or write "
    "hvdkeras.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(optimizer))."
)

XLA_MESSAGE = (
    "hvdkeras collectives cannot run in this XLA-compiled train step: {why}. "
    "(It is compiled with XLA because of compile(jit_compile=True), or the default "
    "jit_compile='auto' on a GPU machine.) Pass an hvdkeras callback to fit() (e.g. hvdkeras.callbacks.BroadcastGlobalVariablesCallback, "
    "which turns XLA off for the train step), or call model.compile(..., jit_compile=False); "
    "in a custom loop, drop jit_compile=True from the tf.function that applies gradients."
)


def enclosing_loss_scale_optimizer(optimizer: Any) -> Optional[Any]:
    """The LossScaleOptimizer whose method is calling into `optimizer`, if any.

    Walks the Python call stack looking for a frame whose `self` is a
    LossScaleOptimizer with `optimizer` as its `inner_optimizer`: that is
    the wrong nesting (a loss-scale decision taken per rank, outside us).
    """
    lso_class = keras.optimizers.LossScaleOptimizer
    # The call stack is the only place that knows who called apply(); Keras
    # passes no caller. sys._getframe is CPython's (and PyPy's) frame access.
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, lso_class) and getattr(owner, "inner_optimizer", None) is optimizer:
            return owner
        frame = frame.f_back
    return None


def check_not_inside_loss_scale_optimizer(optimizer: Any) -> None:
    """Raises ValueError when `optimizer` runs inside a LossScaleOptimizer."""
    if enclosing_loss_scale_optimizer(optimizer) is not None:
        raise ValueError(NESTING_MESSAGE)


def check_not_in_xla() -> None:
    """Raises RuntimeError when called while building an XLA-compiled function."""
    if compat.in_xla_context():
        from hvdkeras.collectives import xla_calls  # lazy: TensorFlow's; XLA here means TF

        why = xla_calls.refusal()
        if why:
            raise RuntimeError(XLA_MESSAGE.format(why=why))

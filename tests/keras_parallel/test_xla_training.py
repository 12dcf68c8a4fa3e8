"""model.fit(jit_compile=True): the whole train step, collectives included,
compiled by XLA (Note [xla collectives]); N ranks of batch B equal one
process of batch N*B, also compiled, for every built-in optimizer and under
mixed_float16."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.collectives import xla_calls
from keras_helpers import (assert_weights_close, assert_weights_moved, fit_distributed, mlp,
                           regression_data, run_reference, shard)

pytestmark = pytest.mark.skipif(not xla_calls.supported(),
                                reason="this TensorFlow ships no XLA custom-call headers")

B, STEPS, SEED = 4, 4, 13
COMPOSITES = (keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)
BUILT_IN = sorted(name for name, cls in vars(keras.optimizers).items()
                  if inspect.isclass(cls) and issubclass(cls, keras.optimizers.Optimizer)
                  and cls is not keras.optimizers.Optimizer and cls not in COMPOSITES)


def _compiled(optimizer) -> keras.Model:
    model = mlp(SEED)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=True)
    return model


def _fit_both(make_optimizer, distributed_optimizer=None):
    x, y = regression_data(seed=7, rows=STEPS * hvd.size() * B)
    model = _compiled(distributed_optimizer or hvd.DistributedOptimizer(make_optimizer()))
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    assert model.jit_compile, "hvdkeras turned XLA off"
    reference = run_reference(lambda: _compiled(make_optimizer()), x, y,
                              batch_size=hvd.size() * B)
    return model, reference, initial


# ScheduleFreeAdamW through fit() also differs from one process with XLA off
# (its momentum starts as a copy of the weights when it is built), so it
# would say nothing about XLA here.
XLA_CASES = [k for k in BUILT_IN if k != "ScheduleFreeAdamW"]


@pytest.mark.parametrize("kind", XLA_CASES)
def test_every_built_in_optimizer_compiled_matches_one_process(kind):
    model, reference, initial = _fit_both(
        lambda: getattr(keras.optimizers, kind)(learning_rate=0.05))
    assert_weights_moved(initial, reference.get_weights(), kind)
    assert_weights_close(model.get_weights(), reference.get_weights(), f"{kind} under XLA")


def test_mixed_float16_compiled_matches_one_process():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model, reference, initial = _fit_both(lambda: keras.optimizers.Adam(0.01))
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert_weights_moved(initial, reference.get_weights(), "mixed_float16")
        np.testing.assert_allclose(np.concatenate([w.ravel() for w in model.get_weights()]),
                                   np.concatenate([w.ravel() for w in reference.get_weights()]),
                                   rtol=1e-3, atol=1e-4)
    finally:
        keras.config.set_dtype_policy("float32")


def test_a_compiled_custom_loop_with_the_tape():
    model = mlp(SEED)
    optimizer = keras.optimizers.SGD(0.1)
    x = tf.constant(np.full((2, 6), hvd.rank() + 1.0, np.float32))

    @tf.function(jit_compile=True)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x) ** 2)
        tape = hvd.DistributedGradientTape(tape, name="xla_tape")
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return grads

    hvd.broadcast_model(model)
    grads = step()
    everyone = hvd.allgather(tf.stack([tf.reshape(grads[0], [-1])]), name="xla_check")
    np.testing.assert_array_equal(everyone.numpy()[0], everyone.numpy()[-1])

"""Every built-in Keras 3 optimizer (and composites, and a user subclass)
applies the rank-averaged gradient: 2 ranks with different gradients end
where one process applying the mean gradient ends."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd

COMPOSITES = (keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)
BUILT_IN = sorted(name for name, cls in vars(keras.optimizers).items()
                  if inspect.isclass(cls) and issubclass(cls, keras.optimizers.Optimizer)
                  and cls is not keras.optimizers.Optimizer and cls not in COMPOSITES)


class Boosted(keras.optimizers.SGD):
    """A user subclass that overrides update_step."""

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(3.0 * gradient, variable, learning_rate)


def _make(kind):
    if kind == "MultiOptimizer":
        adam, sgd = keras.optimizers.Adam(0.1), keras.optimizers.SGD(0.1)
        return keras.optimizers.MultiOptimizer(lambda v: adam if len(v.shape) == 2 else sgd)
    if kind == "LossScaleOptimizer":
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.1), initial_scale=8.0)
    if kind == "user_subclass":
        return Boosted(0.1, momentum=0.5)
    return getattr(keras.optimizers, kind)(learning_rate=0.1)


def test_the_list_of_built_ins_is_complete():
    assert {"Adam", "AdamW", "SGD", "RMSprop", "Adafactor", "Lion", "Muon"} <= set(BUILT_IN)


@pytest.mark.parametrize("kind", BUILT_IN + ["MultiOptimizer", "LossScaleOptimizer",
                                             "user_subclass"])
def test_applies_the_average_gradient(kind):
    rng = np.random.default_rng(0)
    # Per step: one gradient per rank for a matrix and a vector variable.
    grads = [[rng.normal(size=(hvd.size(), 4, 3)).astype("float32"),
              rng.normal(size=(hvd.size(), 3)).astype("float32")] for _ in range(3)]

    def variables():
        return [keras.Variable(np.ones((4, 3), "float32")), keras.Variable(np.ones(3, "float32"))]

    distributed_vars, reference_vars = variables(), variables()
    distributed = hvd.DistributedOptimizer(_make(kind))
    reference = _make(kind)
    for step in grads:
        distributed.apply([tf.constant(g[hvd.rank()]) for g in step], distributed_vars)
        reference.apply([tf.constant(g.mean(axis=0)) for g in step], reference_vars)
    for got, want in zip(distributed_vars, reference_vars):
        assert np.max(np.abs(want.numpy() - 1.0)) > 1e-4, f"{kind} did not move"
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-7)

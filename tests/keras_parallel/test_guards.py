"""Settings that would fail late or hang get fixed or refused early.

Op determinism stays off in this file: Keras silently refuses
jit_compile=True when it is on, and these tests need XLA requested.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from keras_helpers import mlp, regression_data, spread_over_ranks


def _compiled(jit_compile):
    model = mlp(seed=21)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  jit_compile=jit_compile)
    return model


def test_jit_compile_true_trains_compiled_on_the_cpu(capsys):
    """On the CPU the collectives compile (Note [xla collectives]): XLA stays on."""
    model = _compiled(jit_compile=True)
    x, y = regression_data(seed=30 + hvd.rank(), rows=8)
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=4, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert model.jit_compile is True
    assert "jit_compile turned off" not in capsys.readouterr().out
    assert spread_over_ranks(model.get_weights(), "t_jit_weights") == 0
    assert not all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


@pytest.fixture
def as_if_on_a_gpu(monkeypatch):
    """Pure-logic stand-in: makes hvdkeras's XLA check see a GPU (none exists
    here), to test what a GPU machine gets; nothing runs on a GPU."""
    from hvdkeras.collectives import xla_calls
    monkeypatch.setattr(xla_calls.tf.config, "list_logical_devices",
                        lambda kind=None: ["GPU:0"] if kind == "GPU" else [])


def test_on_a_gpu_an_hvdkeras_callback_turns_xla_off(capsys, as_if_on_a_gpu):
    model = _compiled(jit_compile=True)
    x, y = regression_data(seed=32 + hvd.rank(), rows=8)
    model.fit(x, y, batch_size=4, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert model.jit_compile is False
    out = capsys.readouterr().out
    notices = [line for line in out.splitlines() if "jit_compile turned off" in line]
    assert len(notices) == (1 if hvd.rank() == 0 else 0), out
    assert spread_over_ranks(model.get_weights(), "t_gpu_jit_weights") == 0


def test_on_a_gpu_jit_compile_without_callbacks_names_the_fix(as_if_on_a_gpu):
    model = _compiled(jit_compile=True)
    x, y = regression_data(seed=31, rows=8)
    with pytest.raises(RuntimeError, match="cannot run in this XLA-compiled train step: .*GPU.*"
                       "jit_compile=False"):
        model.fit(x, y, batch_size=4, verbose=0)


def test_loss_scale_optimizer_outside_is_refused_at_compile_time_wrapping():
    """mixed_float16 set after wrapping: compile() puts a LossScaleOptimizer
    around the distributed one; the first fit refuses with the fix."""
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
    keras.config.set_dtype_policy("mixed_float16")
    model = mlp(seed=22)
    model.compile(optimizer=optimizer, loss="mse")
    keras.config.set_dtype_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    x, y = regression_data(seed=32, rows=8)
    with pytest.raises(ValueError, match="wrapped inside a LossScaleOptimizer.*before calling"):
        model.fit(x, y, batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="wrapped inside a LossScaleOptimizer"):
        model.fit(x, y, batch_size=4, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])


def test_loss_scale_optimizer_outside_is_refused_in_custom_loops():
    model = mlp(seed=23)
    optimizer = keras.optimizers.LossScaleOptimizer(
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)))
    grads = [tf.zeros_like(v) for v in model.trainable_variables]
    with pytest.raises(ValueError, match="wrapped inside a LossScaleOptimizer"):
        optimizer.apply(grads, model.trainable_variables)
    with pytest.raises(ValueError, match="wrapped inside a LossScaleOptimizer"):
        hvd.DistributedOptimizer(optimizer)


def test_a_model_that_fit_builds_trains_without_xla_and_says_why(capsys):
    """The root's weights are broadcast inside the first step of such a model,
    where XLA cannot create variables: XLA is turned off, with the reason."""
    keras.utils.set_random_seed(40 + hvd.rank())
    model = keras.Sequential([keras.layers.Dense(3), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse",
                  jit_compile=True)
    x, y = regression_data(seed=41 + hvd.rank(), rows=8, outputs=1)
    model.fit(x, y, batch_size=4, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert model.jit_compile is False
    out = capsys.readouterr().out
    assert ("model is built by fit() itself" in out) == (hvd.rank() == 0), out
    assert spread_over_ranks(model.get_weights(), "t_unbuilt_jit_weights") == 0

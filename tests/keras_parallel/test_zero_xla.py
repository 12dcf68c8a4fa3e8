"""Sharded state and weights in XLA-compiled train steps (`jit_compile=True`):
under XLA the weights are gathered and the gradients reduced by allreduces,
since XLA has no compiled allgather or reduce-scatter (Note [xla
collectives]); N ranks still equal one process on the global batch.

Op determinism stays off in this file: Keras silently refuses
jit_compile=True when it is on. Runs at 2 ranks (tests/test_keras_mpi.py).
"""

import keras
import pytest

import hvdkeras as hvd
from keras_helpers import (assert_weights_close, fit_distributed, mlp, regression_data,
                           run_reference, shard)

B, STEPS, SEED = 4, 5, 23


def _compiled(optimizer, jit_compile):
    model = mlp(SEED)
    model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
    return model


@pytest.mark.parametrize("stage", [2, 3])
def test_jit_compiled_steps_equal_one_process(stage):
    x, y = regression_data(seed=9, rows=STEPS * hvd.size() * B)
    model = _compiled(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=stage),
                      jit_compile=True)
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    assert model.jit_compile is True
    reference = run_reference(lambda: _compiled(keras.optimizers.Adam(0.01), False), x, y,
                              batch_size=hvd.size() * B)
    assert not all((a == b).all() for a, b in zip(initial, reference.get_weights()))
    assert_weights_close(model.get_weights(), reference.get_weights(), f"XLA stage {stage}")

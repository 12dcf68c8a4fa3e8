"""HVDKERAS_COLLECTIVE_GRADIENTS: the exact gradients (default) against
Horovod's scaling, on what each rank contributed (Note [collective gradient
conventions] in hvdkeras/collectives/gradients.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.engine.config import collective_gradients
from parallel_helpers import MODES, WORLD_RANK, WORLD_SIZE, assert_exact, run

WEIGHT_SUM = sum(r + 1 for r in range(WORLD_SIZE))


def gradients(mode: str):
    """d/dx of each rank's loss (rank + 1) * sum(collective(x)), for three collectives."""
    def body(x):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            weight = float(WORLD_RANK + 1)
            gathered = weight * tf.reduce_sum(hvd.allgather(x, name="conv_gather"))
            broadcast = weight * tf.reduce_sum(hvd.broadcast(x, 0, name="conv_bcast"))
            scattered = weight * tf.reduce_sum(
                hvd.reducescatter(tf.tile(x, [WORLD_SIZE]), op=hvd.Sum, name="conv_rs"))
        return [tape.gradient(y, x) for y in (gathered, broadcast, scattered)]
    return run(mode, body, tf.ones([2]))


@pytest.mark.parametrize("mode", MODES)
def test_exact_gradients_by_default(mode, monkeypatch):
    monkeypatch.delenv("HVDKERAS_COLLECTIVE_GRADIENTS", raising=False)
    gather, bcast, scatter = gradients(mode)
    assert_exact(gather, np.full(2, WEIGHT_SUM, np.float32), "allgather: sum over ranks")
    assert_exact(bcast, np.full(2, WEIGHT_SUM if WORLD_RANK == 0 else 0, np.float32),
                 "broadcast: the root gets the sum")
    # Every rank's tile feeds every rank's block once: the gathered output gradients.
    assert_exact(scatter, np.full(2, WEIGHT_SUM, np.float32), "reducescatter Sum")


@pytest.mark.parametrize("mode", MODES)
def test_horovod_convention(mode, monkeypatch):
    monkeypatch.setenv("HVDKERAS_COLLECTIVE_GRADIENTS", "horovod")
    gather, bcast, scatter = gradients(mode)
    assert_exact(gather, np.full(2, WEIGHT_SUM / WORLD_SIZE, np.float32), "allgather: average")
    assert_exact(bcast, np.full(2, WEIGHT_SUM / WORLD_SIZE if WORLD_RANK == 0 else 0,
                                np.float32), "broadcast: average")
    assert_exact(scatter, np.full(2, WEIGHT_SUM * WORLD_SIZE, np.float32),
                 "reducescatter Sum: times the size")


def test_bad_setting_is_named():
    with pytest.raises(ValueError, match="HVDKERAS_COLLECTIVE_GRADIENTS='sum': use one of"):
        collective_gradients({"HVDKERAS_COLLECTIVE_GRADIENTS": "sum"})

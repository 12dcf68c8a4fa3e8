"""Collectives inside XLA-compiled functions (Note [xla collectives]): exact
values from what each rank contributed, repeated runs, process sets, and a
clear error for the collectives that have no XLA form."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.collectives import xla_calls
from parallel_helpers import ALLREDUCE_DTYPES, WORLD_RANK, WORLD_SIZE, assert_exact, as_dtype, ids

pytestmark = pytest.mark.skipif(not xla_calls.supported(),
                                reason="this TensorFlow ships no XLA custom-call headers")


@pytest.mark.parametrize("dtype", [d for d in ALLREDUCE_DTYPES if d != tf.bfloat16],
                         ids=ids([d for d in ALLREDUCE_DTYPES if d != tf.bfloat16]))
def test_allreduce_and_broadcast_compiled(dtype):
    @tf.function(jit_compile=True)
    def step(x, y):
        total = hvd.allreduce(x, op=hvd.Sum, name="xla_sum")
        biggest, = hvd.grouped_allreduce([y], op=hvd.Max, name="xla_max")
        root = hvd.broadcast(x + y, root_rank=WORLD_SIZE - 1, name="xla_bcast")
        return total, biggest, root

    mine = as_dtype(np.arange(6).reshape(2, 3) % 5 + WORLD_RANK, dtype)
    for repeat in range(3):  # the compiled step runs again under the same names
        total, biggest, root = step(tf.constant(mine), tf.constant(mine))
        contributions = [as_dtype(np.arange(6).reshape(2, 3) % 5 + r, dtype)
                         for r in range(WORLD_SIZE)]
        assert_exact(total, as_dtype(np.sum(contributions, axis=0), dtype), "Sum")
        assert_exact(biggest, contributions[-1], "Max")
        last = contributions[-1]
        assert_exact(root, as_dtype(last.astype(np.float64) * 2, dtype), "broadcast")


def test_average_scaling_and_a_process_set_compiled():
    if WORLD_SIZE < 2:
        pytest.skip("a proper process set needs 2+ ranks")
    firsts = hvd.add_process_set(range(WORLD_SIZE - 1))
    try:
        @tf.function(jit_compile=True)
        def step(x):
            mean = hvd.allreduce(x, op=hvd.Average, prescale_factor=2.0, name="xla_avg")
            if firsts.included():
                return mean, hvd.allreduce(x, op=hvd.Sum, name="xla_set", process_set=firsts)
            return mean, x

        mean, in_set = step(tf.fill([4], float(WORLD_RANK + 1)))
        assert_exact(mean, np.full(4, 2.0 * sum(range(1, WORLD_SIZE + 1)) / WORLD_SIZE,
                                   np.float32))
        if firsts.included():
            assert_exact(in_set, np.full(4, float(sum(range(1, WORLD_SIZE))), np.float32))
    finally:
        hvd.remove_process_set(firsts)


@pytest.mark.parametrize("what", ["allgather", "alltoall", "reducescatter"])
def test_collectives_without_an_xla_form_say_so(what):
    calls = {"allgather": lambda x: hvd.allgather(x),
             "alltoall": lambda x: hvd.alltoall(x, splits=[2] + [0] * (WORLD_SIZE - 1)),
             "reducescatter": lambda x: hvd.reducescatter(x, op=hvd.Sum)}
    with pytest.raises(ValueError, match=f"hvdkeras.{what} has no XLA form"):
        tf.function(calls[what], jit_compile=True)(tf.ones([2]))

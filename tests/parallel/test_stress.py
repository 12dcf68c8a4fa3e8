"""Many named collectives submitted in a different order on every rank.

Runs under mpiexec (see tests/test_collectives_mpi.py). Each step builds one
tf.function holding the same 200 named allreduces (t0..t199, same shapes,
dtypes and ops on every rank) but creates them in a rank-specific random
order, so every rank hands them to the engine in a different order. The
engine must match them by name, fuse what it can and return exact results,
step after step (the later steps run on the response cache's fast path).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import WORLD_RANK, WORLD_SIZE, as_dtype, assert_exact, tensor

N_OPS = 200
# Each step retraces a 200-op function (~0.5 s of CPU per rank: 50 steps took
# about 60 s with 3 ranks on 2 cores, 20 take about 25 s). 20 steps are 4,000
# allreduces per rank in 20 orders per rank; HVDKERAS_STRESS_STEPS sets more
# (or fewer, for quick local runs).
N_STEPS = int(os.environ.get("HVDKERAS_STRESS_STEPS", "20"))
REUSE_STEPS = 20
OPS = (hvd.Sum, hvd.Min, hvd.Max)
OP_NAMES = {hvd.Sum: "Sum", hvd.Min: "Min", hvd.Max: "Max"}


def make_specs():
    """(shape, dtype, op) of t0..t199, from a seed every rank shares."""
    rng = np.random.RandomState(1234)
    specs = []
    for _ in range(N_OPS):
        shape = tuple(int(d) for d in rng.randint(1, 7, size=rng.randint(1, 4)))
        dtype = (tf.float32, tf.int32)[rng.randint(2)]
        op = OPS[rng.randint(len(OPS))]
        specs.append((shape, dtype, op))
    return specs


SPECS = make_specs()


def contribution(k: int, step: int, rank: int) -> np.ndarray:
    """Rank `rank`'s value of tensor t<k> at `step`: small integers, exact in float32."""
    shape = SPECS[k][0]
    i = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    return (i * (rank + 1) + k + step + 3 * rank) % 11


def expected(k: int, step: int) -> np.ndarray:
    _, dtype, op = SPECS[k]
    parts = np.stack([contribution(k, step, r) for r in range(WORLD_SIZE)])
    reduce = {hvd.Sum: np.sum, hvd.Min: np.min, hvd.Max: np.max}[op]
    return as_dtype(reduce(parts, axis=0), dtype)


def submission_order(step: int, rank: int) -> list[int]:
    """A permutation of 0..199 that differs per rank and per step."""
    order = list(range(N_OPS))
    np.random.RandomState(1000 * step + rank).shuffle(order)
    return order


def build_step(order: list[int]):
    """One tf.function whose allreduce nodes are created in `order`.

    The creation order changes the graph; TensorFlow's executor then starts
    the 200 independent nodes from its thread pool in an order of its own.
    Measured with the engine timeline (2 ranks): the arrival orders of two
    ranks correlate at about 0.1, so the engine really sees different
    orders. Inputs are arguments (not constants that grappler could fold).
    autograph=False: autograph-converting hvdkeras' Python code would make
    each trace several times slower.
    """
    @tf.function(autograph=False)
    def step(*inputs):
        outputs = [None] * N_OPS
        for k in order:
            outputs[k] = hvd.allreduce(inputs[k], op=SPECS[k][2], name=f"t{k}")
        return outputs
    return step


def test_orders_really_differ():
    """Sanity check of the setup: no two ranks share an order within a step."""
    for step in range(N_STEPS):
        orders = {tuple(submission_order(step, r)) for r in range(WORLD_SIZE)}
        assert len(orders) == WORLD_SIZE


@pytest.mark.skipif(WORLD_SIZE < 2, reason="one rank has only one submission order")
def test_shuffled_named_allreduces(record_property):
    """N_STEPS steps x 200 allreduces, each rank in its own order: exact results every step."""
    start = time.perf_counter()
    for step in range(N_STEPS):
        inputs = [tensor(contribution(k, step, WORLD_RANK), SPECS[k][1]) for k in range(N_OPS)]
        outputs = build_step(submission_order(step, WORLD_RANK))(*inputs)
        assert len(outputs) == N_OPS
        for k, out in enumerate(outputs):
            assert_exact(out, expected(k, step), f"step {step} t{k} ({OP_NAMES[SPECS[k][2]]})")
    elapsed = time.perf_counter() - start
    record_property("seconds", elapsed)
    print(f"\nrank {WORLD_RANK}/{WORLD_SIZE}: {N_STEPS} steps x {N_OPS} ops in {elapsed:.1f} s")


def test_one_function_called_many_times():
    """One shuffled function called again and again (response-cache fast path, no retracing)."""
    fn = build_step(submission_order(0, WORLD_RANK))
    for step in range(REUSE_STEPS):
        inputs = [tensor(contribution(k, step, WORLD_RANK), SPECS[k][1]) for k in range(N_OPS)]
        outputs = fn(*inputs)
        for k, out in enumerate(outputs):
            assert_exact(out, expected(k, step), f"step {step} t{k}")

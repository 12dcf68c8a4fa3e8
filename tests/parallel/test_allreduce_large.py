"""allreduce of buffers large enough for the engine's big-buffer paths.

Above 64 KiB the engine reduces through its shared-memory allreduce when
every rank shares a host (the default here), or through MPI in 1 MiB
in-place pieces (HVDKERAS_SHM_ALLREDUCE=0; tests/test_collectives_mpi.py
runs this file both ways). The shapes cross piece boundaries, give the ranks
slices of unequal length, and mix a tiny tensor into a fused group so the
64-byte padding between tensors is exercised. Exact results, as in
test_allreduce.py.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import ALLREDUCE_DTYPES, FLOAT_DTYPES, MODES, assert_exact, ids, run
from test_allreduce import OP_NAMES, OPS, expected, mine

LONE = (257, 1031)  # 264,967 elements: a quarter MiB even as uint8
GROUP = ((70001,), (3, 50001), (5,))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS, ids=OP_NAMES.get)
@pytest.mark.parametrize("dtype", ALLREDUCE_DTYPES, ids=ids(ALLREDUCE_DTYPES))
def test_large_lone_tensor(dtype, op, mode):
    got = run(mode, lambda x: hvd.allreduce(x, op=op), mine(op, LONE, dtype))
    assert_exact(got, expected(op, LONE, dtype), f"{OP_NAMES[op]} {dtype.name}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS, ids=OP_NAMES.get)
@pytest.mark.parametrize("dtype", ALLREDUCE_DTYPES, ids=ids(ALLREDUCE_DTYPES))
def test_large_fused_group(dtype, op, mode):
    got = run(mode, lambda *xs: hvd.grouped_allreduce(list(xs), op=op),
              *[mine(op, shape, dtype) for shape in GROUP])
    for shape, result in zip(GROUP, got):
        assert_exact(result, expected(op, shape, dtype), f"{OP_NAMES[op]} {dtype.name}{shape}")


@pytest.mark.parametrize("prescale,postscale", [(0.5, 1.0), (1.0, 4.0), (0.5, 4.0)])
@pytest.mark.parametrize("op", (hvd.Sum, hvd.Average), ids=OP_NAMES.get)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids(FLOAT_DTYPES))
def test_large_prescale_and_postscale(dtype, op, prescale, postscale):
    scales = {"prescale": prescale, "postscale": postscale}
    lone = hvd.allreduce(mine(op, LONE, dtype), op=op, prescale_factor=prescale,
                         postscale_factor=postscale)
    assert_exact(lone, expected(op, LONE, dtype, **scales))
    group = hvd.grouped_allreduce([mine(op, s, dtype) for s in GROUP], op=op,
                                  prescale_factor=prescale, postscale_factor=postscale)
    for shape, result in zip(GROUP, group):
        assert_exact(result, expected(op, shape, dtype, **scales))


def test_large_input_reduced_in_place_inside_a_function():
    """A fresh tensor made in the function is reduced in its own buffer."""
    base = mine(hvd.Sum, LONE, tf.float32)

    @tf.function
    def step(x):
        return hvd.allreduce(x * 2.0, op=hvd.Sum)

    for _ in range(3):  # repeated: buffers come back from the pool
        assert_exact(step(base), expected(hvd.Sum, LONE, tf.float32) * 2)


def test_large_results_held_while_later_ones_are_reduced():
    """Results kept alive stay intact while later allreduces run.

    Results of the shared-memory allreduce live in shared memory until the
    framework releases them (Note [shared outputs] in ops/core/shm_arena.h);
    later collectives must take other memory, or the staging way when the
    region is full (test_collectives_mpi.py runs this file with a 1 MiB
    region too, so some results fit and some do not).
    """
    held = []
    for i in range(12):
        lone = hvd.allreduce(mine(hvd.Sum, LONE, tf.float32) + float(i), op=hvd.Sum,
                             name=f"held_lone_{i}")
        group = hvd.grouped_allreduce([mine(hvd.Sum, s, tf.float64) * float(i) for s in GROUP],
                                      op=hvd.Sum, name=f"held_group_{i}")
        held.append((i, lone, group))
    for i, lone, group in held:
        assert_exact(lone, expected(hvd.Sum, LONE, tf.float32) + float(i * hvd.size()),
                     f"lone result {i}")
        for shape, result in zip(GROUP, group):
            assert_exact(result, expected(hvd.Sum, shape, tf.float64) * float(i),
                         f"group result {i} {shape}")

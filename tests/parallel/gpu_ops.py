"""GPU-only checks of the collectives, run on every rank under mpiexec by
tests/test_gpu.py with HVDKERAS_TEST_DEVICE=GPU (so tests/parallel/conftest.py
pins one GPU per rank). The regular tests/parallel files run there too, on
the GPU; this file adds what only a GPU has: that the ops stay on the GPU,
the device fusion buffer's packing over odd sizes, alignments and more
tensors than one copy launch takes, and CPU and GPU tensors in one step.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.collectives import xla_calls
from parallel_helpers import (ALLREDUCE_DTYPES, MODES, WORLD_RANK, WORLD_SIZE, as_dtype,
                              assert_exact, ids, run, tensor)

# Element counts around the fused buffer's 256-byte alignment and the copy
# kernel's 16-byte steps, for 1-, 2-, 4- and 8-byte elements.
ODD_COUNTS = (1, 2, 3, 5, 7, 15, 16, 17, 31, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023,
              4097, 65537)


def test_a_gpu_is_pinned():
    assert len(tf.config.get_visible_devices("GPU")) == 1


@pytest.mark.parametrize("mode", MODES)
def test_results_stay_on_the_gpu(mode):
    x = tensor(np.arange(6).reshape(2, 3) + WORLD_RANK, tf.float32)
    ops = {
        "allreduce": lambda t: hvd.allreduce(t, op=hvd.Sum),
        "broadcast": lambda t: hvd.broadcast(t, root_rank=0),
        "allgather": lambda t: hvd.allgather(t),
        "alltoall": lambda t: hvd.alltoall(tf.tile(t, [WORLD_SIZE, 1])),
        "reducescatter": lambda t: hvd.reducescatter(tf.tile(t, [WORLD_SIZE, 1]), op=hvd.Sum),
    }
    for name, op in ops.items():
        with tf.device("/GPU:0"):
            got = run(mode, op, x)
        assert "GPU" in got.device, f"{name} ran on {got.device}"


def _contribution(count: int, index: int, rank: int) -> np.ndarray:
    # Small integers: every sum over ranks is exact in every dtype.
    return (np.arange(count) + index + rank) % 5


@pytest.mark.parametrize("dtype", ALLREDUCE_DTYPES, ids=ids(ALLREDUCE_DTYPES))
@pytest.mark.parametrize("mode", MODES)
def test_fused_odd_sizes_and_alignments(dtype, mode):
    inputs = [tensor(_contribution(n, i, WORLD_RANK), dtype) for i, n in enumerate(ODD_COUNTS)]
    with tf.device("/GPU:0"):
        got = run(mode, lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Sum), *inputs)
    for i, (n, result) in enumerate(zip(ODD_COUNTS, got)):
        expected = sum(_contribution(n, i, r) for r in range(WORLD_SIZE))
        assert_exact(result, as_dtype(expected, dtype), f"tensor {i} of {n} elements")


@pytest.mark.parametrize("count", (63, 64, 65, 150))
def test_more_tensors_than_one_copy_launch_takes(count):
    inputs = [tensor(_contribution(i % 7 + 1, i, WORLD_RANK), tf.float32) for i in range(count)]
    with tf.device("/GPU:0"):
        got = hvd.grouped_allreduce(inputs, op=hvd.Average, prescale_factor=2.0,
                                    postscale_factor=0.5)
    for i, result in enumerate(got):
        contributions = [_contribution(i % 7 + 1, i, r) for r in range(WORLD_SIZE)]
        expected = sum(contributions) / WORLD_SIZE
        assert_exact(result, expected.astype(np.float32), f"tensor {i}")


def test_scaling_and_averaging_on_the_device():
    x = tensor(np.array([3, 6, 9, 12]) * (WORLD_RANK + 1), tf.float32)
    with tf.device("/GPU:0"):
        got = hvd.allreduce(x, op=hvd.Average, prescale_factor=0.5, postscale_factor=4.0)
    ranks = sum(r + 1 for r in range(WORLD_SIZE))
    assert_exact(got, (np.array([3, 6, 9, 12]) * ranks * 0.5 / WORLD_SIZE * 4.0)
                 .astype(np.float32))
    ints = tensor(np.array([7, -7, 9]) + WORLD_RANK, tf.int32)
    with tf.device("/GPU:0"):
        got = hvd.allreduce(ints, op=hvd.Average)
    total = sum(np.array([7, -7, 9]) + r for r in range(WORLD_SIZE))
    assert_exact(got, np.trunc(total / WORLD_SIZE).astype(np.int32))  # toward zero, as on CPU


@pytest.mark.parametrize("mode", MODES)
def test_cpu_and_gpu_tensors_in_one_step(mode):
    def step(a, b):
        with tf.device("/CPU:0"):
            on_cpu = hvd.allreduce(tf.identity(a), op=hvd.Sum, name="mixed.cpu")
        with tf.device("/GPU:0"):
            on_gpu = hvd.allreduce(tf.identity(b), op=hvd.Sum, name="mixed.gpu")
        return on_cpu, on_gpu

    a = tensor(np.arange(4) + WORLD_RANK, tf.float32)
    b = tensor(np.arange(3) * (WORLD_RANK + 1), tf.int64)
    on_cpu, on_gpu = run(mode, step, a, b)
    assert "CPU" in on_cpu.device and "GPU" in on_gpu.device
    assert_exact(on_cpu, sum(np.arange(4) + r for r in range(WORLD_SIZE)).astype(np.float32))
    assert_exact(on_gpu, sum(np.arange(3) * (r + 1) for r in range(WORLD_SIZE)).astype(np.int64))


@pytest.mark.skipif(not xla_calls.gpu_supported(), reason="no XLA custom-call targets for GPUs")
def test_xla_compiled_step_reduces_on_the_gpu():
    """The CUDA custom-call targets (Note [xla collectives]): a compiled step on the GPU."""
    @tf.function(jit_compile=True)
    def step(x):
        return hvd.allreduce(x * 2.0, op=hvd.Sum, name="xla_gpu_sum")

    with tf.device("/GPU:0"):
        for _ in range(2):
            got = step(tensor(np.arange(6).reshape(2, 3) + WORLD_RANK, tf.float32))
            assert "GPU" in got.device, got.device
            expected = sum(2.0 * (np.arange(6).reshape(2, 3) + r) for r in range(WORLD_SIZE))
            assert_exact(got, expected.astype(np.float32))


@pytest.mark.skipif(WORLD_SIZE < 2, reason="at 1 rank a one-rank set is the global set")
def test_two_process_sets_reduce_on_one_gpu_at_once():
    """Two engines run at once on one GPU, each on its own lane (Note [device
    lanes] in ops/core/device.h): the global set's and this rank's own
    one-rank set's fused batches, from two threads, stay exact."""
    import threading

    singles = [hvd.add_process_set([r]) for r in range(WORLD_SIZE)]
    mine = singles[WORLD_RANK]
    results, errors = {}, []

    def reduce(which):
        try:
            with tf.device("/GPU:0"):
                for step in range(20):
                    value = float(WORLD_RANK + 1 + 10 * which)
                    xs = [tf.fill([1000 + step, 3], value), tf.fill([7], value)]
                    results[(which, step)] = hvd.grouped_allreduce(
                        xs, op=hvd.Sum, name=f"lanes{which}.{step}",
                        process_set=hvd.global_process_set if which == 0 else mine)
        except Exception as e:  # reported on the main thread
            errors.append(e)

    threads = [threading.Thread(target=reduce, args=(which,)) for which in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for ps in singles:
        hvd.remove_process_set(ps)
    assert not errors, errors
    for (which, step), (big, small) in results.items():
        total = (sum(r + 1 for r in range(WORLD_SIZE)) if which == 0
                 else WORLD_RANK + 1 + 10)
        assert "GPU" in big.device
        assert_exact(big, np.full([1000 + step, 3], total, np.float32))
        assert_exact(small, np.full([7], total, np.float32))

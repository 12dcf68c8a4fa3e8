"""Cross-rank mismatches, invalid arguments, shutdown and re-init.

Runs under mpiexec (see tests/test_collectives_mpi.py). In each mismatch test
the last rank submits something different under the same eager name; the
coordinator must fail the collective on EVERY rank with a
FailedPreconditionError naming the tensor and what each rank sent (grouped
as coordinator.cc formats it), and the world must stay usable: the next
collective succeeds with the right value.

The shutdown/re-init tests come last in this file: they stop the world and
start it again (the session fixture's final shutdown copes either way).
"""

from __future__ import annotations

import queue
import threading

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import (
    WORLD_RANK, WORLD_SIZE, assert_exact, describe_by_rank, last_rank_differs, needs_two_ranks,
)

IS_LAST = WORLD_RANK == WORLD_SIZE - 1


def assert_world_still_works(name: str) -> None:
    """A good allreduce right after a failed one returns the right value on every rank."""
    got = hvd.allreduce(tf.constant([WORLD_RANK + 1, 10]), op=hvd.Sum, name=f"{name}_after")
    assert_exact(got, np.array([WORLD_SIZE * (WORLD_SIZE + 1) // 2, 10 * WORLD_SIZE], np.int32))


def expect_failure(call, message: str, error=tf.errors.FailedPreconditionError) -> None:
    """`call()` raises `error` on this rank, and its message contains `message`."""
    with pytest.raises(error) as info:
        result = call()
        if isinstance(result, (list, tuple)):
            [t.numpy() for t in result]
        else:
            result.numpy()
    assert message in info.value.message, (
        f"rank {WORLD_RANK}: expected {message!r} in the error, got:\n{info.value.message}")


# ---------------------------------------------------------------- mismatches (size >= 2)

@needs_two_ranks
def test_mismatched_shapes():
    """[2, 3] on most ranks, [3, 3] on the last one."""
    x = tf.zeros([3, 3] if IS_LAST else [2, 3])
    expect_failure(
        lambda: hvd.allreduce(x, op=hvd.Sum, name="bad_shape"),
        "Mismatched shapes for allreduce of tensor 'bad_shape' across ranks: "
        + last_rank_differs("[2, 3]", "[3, 3]"))
    assert_world_still_works("bad_shape")


@needs_two_ranks
def test_mismatched_dtypes():
    """float32 on most ranks, int32 on the last one."""
    x = tf.zeros([4], tf.int32 if IS_LAST else tf.float32)
    expect_failure(
        lambda: hvd.allreduce(x, op=hvd.Sum, name="bad_dtype"),
        "Mismatched data types for allreduce of tensor 'bad_dtype' across ranks: "
        + last_rank_differs("float32", "int32"))
    assert_world_still_works("bad_dtype")


@needs_two_ranks
def test_mismatched_reduce_ops():
    """Sum on most ranks, Max on the last one."""
    op = hvd.Max if IS_LAST else hvd.Sum
    expect_failure(
        lambda: hvd.allreduce(tf.ones([2]), op=op, name="bad_op"),
        "Mismatched reduction ops for allreduce of tensor 'bad_op' across ranks: "
        + last_rank_differs("Sum", "Max"))
    assert_world_still_works("bad_op")


@needs_two_ranks
@pytest.mark.parametrize("odd_scales,odd_text", [
    ((2.0, 1.0), "prescale 2 / postscale 1"),
    ((1.0, 0.5), "prescale 1 / postscale 0.5"),
])
def test_mismatched_scale_factors(odd_scales, odd_text):
    """Different prescale (or postscale) factors on the last rank."""
    pre, post = odd_scales if IS_LAST else (1.0, 1.0)
    expect_failure(
        lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum, prescale_factor=pre,
                              postscale_factor=post, name="bad_scale"),
        "Mismatched scale factors for allreduce of tensor 'bad_scale' across ranks: "
        + last_rank_differs("prescale 1 / postscale 1", odd_text))
    assert_world_still_works("bad_scale")


@needs_two_ranks
def test_mismatched_broadcast_roots():
    """Root 0 on most ranks, root 1 on the last one."""
    root = 1 if IS_LAST else 0
    expect_failure(
        lambda: hvd.broadcast(tf.ones([2]), root_rank=root, name="bad_root"),
        "Mismatched root ranks for broadcast of tensor 'bad_root' across ranks: "
        + last_rank_differs("root 0", "root 1"))
    assert_world_still_works("bad_root")


@needs_two_ranks
def test_mismatched_tensor_counts_in_a_group():
    """A grouped allreduce of 2 tensors on most ranks, 3 on the last one."""
    xs = [tf.ones([2]) for _ in range(3 if IS_LAST else 2)]
    expect_failure(
        lambda: hvd.grouped_allreduce(xs, op=hvd.Sum, name="bad_count"),
        "Mismatched tensor counts for allreduce of tensor 'bad_count' across ranks: "
        + last_rank_differs("2 tensor(s)", "3 tensor(s)"))
    assert_world_still_works("bad_count")


@needs_two_ranks
def test_mismatched_operations():
    """allreduce on most ranks, broadcast under the same name on the last one."""
    x = tf.ones([2])
    call = ((lambda: hvd.broadcast(x, root_rank=0, name="bad_kind")) if IS_LAST else
            (lambda: hvd.allreduce(x, op=hvd.Sum, name="bad_kind")))
    expect_failure(call, "Mismatched operations for tensor 'bad_kind' across ranks: "
                   + last_rank_differs("allreduce", "broadcast"))
    assert_world_still_works("bad_kind")


@needs_two_ranks
def test_mismatch_inside_tf_function():
    """A mismatch in a graph fails the function call on every rank, naming the node."""
    shape = [3, 3] if IS_LAST else [2, 3]
    fn = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="bad_graph_shape"))
    expect_failure(
        lambda: fn(tf.zeros(shape)),
        "Mismatched shapes for allreduce of tensor 'bad_graph_shape' across ranks: "
        + last_rank_differs("[2, 3]", "[3, 3]"))
    assert_world_still_works("bad_graph_shape")


@needs_two_ranks
def test_mismatch_groups_every_distinct_value():
    """Every rank sends its own shape: each rank is listed with its value, in rank order."""
    x = tf.zeros([WORLD_RANK + 1])
    expect_failure(
        lambda: hvd.allreduce(x, op=hvd.Sum, name="all_different"),
        "Mismatched shapes for allreduce of tensor 'all_different' across ranks: "
        + describe_by_rank([f"[{r + 1}]" for r in range(WORLD_SIZE)]))
    assert_world_still_works("all_different")


# ---------------------------------------------------------------- invalid arguments (any size)

@pytest.mark.parametrize("root", [WORLD_SIZE, -1], ids=["size", "minus1"])
def test_invalid_broadcast_root(root):
    """A root outside 0..size-1 fails on every rank with the valid range in the message."""
    expect_failure(
        lambda: hvd.broadcast(tf.ones([2]), root_rank=root, name="bad_root_value"),
        f"Invalid root rank {root} for broadcast of tensor 'bad_root_value': the world has "
        f"{WORLD_SIZE} rank(s), so the root must be in 0..{WORLD_SIZE - 1}.")
    assert_world_still_works("bad_root_value")


@needs_two_ranks
def test_duplicate_name_in_flight():
    """A second collective under a name that is still in flight fails at once on that rank.

    Every rank but 0 submits "dup" from two threads; rank 0 holds its "dup"
    back (behind an MPI barrier) so the first one cannot finish. Exactly one
    of the two must fail with InvalidArgumentError; after the barrier, rank 0
    joins in and the surviving one completes with the right sum.
    """
    from mpi4py import MPI

    if not hvd.mpi_threads_supported():
        pytest.skip("needs MPI_THREAD_MULTIPLE to use mpi4py alongside the engine")
    comm = MPI.COMM_WORLD
    x = tf.constant([float(WORLD_RANK + 1)])
    want = np.array([float(WORLD_SIZE * (WORLD_SIZE + 1) // 2)], np.float32)
    if WORLD_RANK == 0:
        comm.Barrier()
        assert_exact(hvd.allreduce(x, op=hvd.Sum, name="dup"), want)
        return
    results: queue.Queue = queue.Queue()

    def submit():
        try:
            results.put(("ok", hvd.allreduce(x, op=hvd.Sum, name="dup")))
        except Exception as e:  # noqa: BLE001 - reported through the queue
            results.put(("error", e))

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        kind, first = results.get(timeout=60)
    finally:
        comm.Barrier()  # let rank 0 submit even when the check fails
    assert kind == "error", f"the duplicate did not fail; it returned {first!r}"
    assert isinstance(first, tf.errors.InvalidArgumentError), repr(first)
    assert (f"A collective named 'dup' is already in flight on rank {WORLD_RANK}: "
            "concurrent collectives need distinct names.") in first.message
    kind, second = results.get(timeout=60)
    for t in threads:
        t.join(timeout=60)
    assert kind == "ok", repr(second)
    assert_exact(second, want)


# ---------------------------------------------------------------- shutdown and re-init (last)

def test_shutdown_then_reinit():
    """After shutdown(): the Python API refuses (ValueError naming init()); a function traced
    before the shutdown fails with FailedPreconditionError ("shut down"); init() again
    restarts the world and collectives work, eagerly and in that same function."""
    assert hvd.is_initialized()
    fn = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="traced_before_shutdown"))
    x = tf.constant([float(WORLD_RANK + 1)])
    total = np.array([float(WORLD_SIZE * (WORLD_SIZE + 1) // 2)], np.float32)
    assert_exact(fn(x), total)

    hvd.shutdown()
    try:
        assert not hvd.is_initialized()
        for call in (lambda: hvd.allreduce(x), lambda: hvd.broadcast(x),
                     lambda: hvd.grouped_allreduce([x]), hvd.size, hvd.rank):
            with pytest.raises(ValueError, match=r"init\(\)"):
                call()
        with pytest.raises(tf.errors.FailedPreconditionError, match="shut down") as info:
            fn(x)
        assert "traced_before_shutdown" in info.value.message
        hvd.shutdown()  # a second shutdown is a no-op
    finally:
        hvd.init()

    assert hvd.is_initialized() and hvd.size() == WORLD_SIZE and hvd.rank() == WORLD_RANK
    assert_exact(hvd.allreduce(x, op=hvd.Sum, name="after_reinit"), total)
    assert_exact(hvd.broadcast(x, root_rank=WORLD_SIZE - 1),
                 np.array([float(WORLD_SIZE)], np.float32))
    assert_exact(fn(x), total)


def test_allreduce_of_constants_in_a_function_is_not_folded():
    """Every call of a tf.function must run its collectives, even on constant inputs.

    Detected without any cross-rank asymmetry: after shutdown() a function
    that still communicates must fail; a folded one silently succeeds.
    """
    fn = tf.function(lambda: hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum,
                                           name="constant_input"))
    assert_exact(fn(), np.array([1.0, 2.0], np.float32) * WORLD_SIZE)
    hvd.shutdown()
    try:
        with pytest.raises(tf.errors.FailedPreconditionError, match="shut down"):
            fn()
    finally:
        hvd.init()

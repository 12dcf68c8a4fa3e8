"""Invalid arguments, names in flight, shutdown and re-init.

Runs under mpiexec (see tests/test_collectives_mpi.py). Cross-rank mismatches
are one table in test_mismatches.py. After a failure the world must stay
usable: the next collective succeeds with the right value.

The shutdown/re-init tests come last in this file: they stop the world and
start it again (the session fixture's final shutdown copes either way).
"""

from __future__ import annotations

import re
import queue
import threading

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import (
    WORLD_RANK, WORLD_SIZE, assert_exact, needs_two_ranks,
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


# ---------------------------------------------------------------- invalid arguments (any size)

@pytest.mark.parametrize("root", [WORLD_SIZE, -1], ids=["size", "minus1"])
def test_invalid_broadcast_root(root):
    """A root outside 0..size-1 is a ValueError on every rank, with the valid
    range in the message, before anything is sent."""
    with pytest.raises(ValueError, match=re.escape(
            f"Invalid root_rank {root}: the job has {WORLD_SIZE} rank(s), so it must be in "
            f"0..{WORLD_SIZE - 1}.")):
        hvd.broadcast(tf.ones([2]), root_rank=root, name="bad_root_value")
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

"""join(): ranks with uneven amounts of work finish together.

Runs under mpiexec (see tests/test_collectives_mpi.py) with 1, 2 and 3 ranks.
A rank that has called join() takes part in the other ranks' collectives
with a neutral contribution: zeros for Sum/Average (averages still divide by
the full world size), no rows for allgather/alltoall, the identity for
Min/Max/Product. join() returns the rank that joined last, on every rank.

Why the join order is known: with rank r running steps_of(r) steps, a rank
that runs more steps than r cannot finish step steps_of(r) until r's join
has reached the coordinator, so ranks join in order of their step counts.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import MODES, WORLD_RANK, WORLD_SIZE, assert_exact, needs_two_ranks

RANKS = range(WORLD_SIZE)


def step_value(rank: int, step: int) -> np.ndarray:
    return np.array([rank + 1 + step, 10 * (rank + 1), step, 1], np.float32)


def make_step(mode: str):
    def step(x):
        total = hvd.allreduce(x, op=hvd.Sum, name="join_sum")
        mean = hvd.allreduce(x, op=hvd.Average, name="join_avg")
        ints = hvd.allreduce(tf.cast(x, tf.int32), op=hvd.Sum, name="join_int")
        return total, mean, ints
    return tf.function(step) if mode == "function" else step


def run_uneven(mode: str, steps_of, join=hvd.join) -> int:
    """Rank r runs steps_of(r) steps of Sum/Average allreduce, then joins.

    Checks every step's results: ranks that have joined count as zeros, and
    the average divides by the full world size. Returns join()'s value.
    """
    step = make_step(mode)
    for k in range(steps_of(WORLD_RANK)):
        active = [r for r in RANKS if steps_of(r) > k]
        want = np.sum([step_value(r, k) for r in active], axis=0, dtype=np.float32)
        total, mean, ints = step(tf.constant(step_value(WORLD_RANK, k)))
        what = f"step {k} (active ranks {active})"
        assert_exact(total, want, f"Sum, {what}")
        assert_exact(mean, want / np.float32(WORLD_SIZE), f"Average, {what}")
        assert_exact(ints, want.astype(np.int32), f"int Sum, {what}")
    last = join()
    return int(last)


def everyone_agrees(value: int) -> None:
    got = hvd.allgather(tf.constant([value], tf.int64), name="join_agree").numpy()
    assert (got == value).all(), f"ranks disagree: {got}"


def check_normal_steps(mode: str, steps: int = 3) -> None:
    """After join, every rank runs the same names again with full results."""
    step = make_step(mode)
    for k in range(steps):
        want = np.sum([step_value(r, k) for r in RANKS], axis=0, dtype=np.float32)
        total, mean, ints = step(tf.constant(step_value(WORLD_RANK, k)))
        assert_exact(total, want, f"Sum after join, step {k}")
        assert_exact(mean, want / np.float32(WORLD_SIZE), f"Average after join, step {k}")
        assert_exact(ints, want.astype(np.int32), f"int Sum after join, step {k}")


@pytest.mark.parametrize("mode", MODES)
def test_uneven_steps_then_join(mode):
    """Rank r runs r + 2 steps; ranks join in rank order, so the last is size - 1."""
    check_normal_steps(mode)  # the names are cached (fast path) before anyone joins
    last = run_uneven(mode, lambda r: r + 2)
    assert last == WORLD_SIZE - 1
    everyone_agrees(last)
    check_normal_steps(mode, steps=5)


@pytest.mark.parametrize("mode", MODES)
def test_join_twice_in_opposite_orders(mode):
    """Join state resets after each join: a second round with reversed roles."""
    assert run_uneven(mode, lambda r: r + 2) == WORLD_SIZE - 1
    check_normal_steps(mode)
    assert run_uneven(mode, lambda r: WORLD_SIZE - r + 1) == 0
    check_normal_steps(mode)


def test_join_with_even_steps():
    """No rank has extra work: join still returns one rank, the same everywhere."""
    last = run_uneven("eager", lambda r: 3)
    assert 0 <= last < WORLD_SIZE
    everyone_agrees(last)


def test_join_inside_tf_function():
    """In a graph join() returns an int32 tensor with the last rank."""
    @tf.function
    def join_in_graph():
        return hvd.join()

    last = run_uneven("eager", lambda r: r + 1, join=join_in_graph)
    assert last == WORLD_SIZE - 1
    check_normal_steps("function")


def test_join_immediately():
    """A rank with no work at all joins at once."""
    last = run_uneven("eager", lambda r: 0 if r == 0 else 2)
    if WORLD_SIZE == 1:
        assert last == 0
    else:
        assert last != 0
    everyone_agrees(last)


# ---------------------------------------------------------------- other ops while rank 0 has joined

def active_ranks() -> list[int]:
    return [r for r in RANKS if r != 0]


def joined_rank_0_runs(body) -> None:
    """Rank 0 joins at once; the others run body() (with rank 0 standing in), then join."""
    if WORLD_RANK == 0:
        last = hvd.join()
    else:
        body()
        last = hvd.join()
    if WORLD_SIZE == 1:
        assert last == 0
    else:
        assert last in active_ranks()
    everyone_agrees(last)


@needs_two_ranks
@pytest.mark.parametrize("mode", MODES)
def test_allgather_while_a_rank_has_joined(mode):
    """The joined rank contributes no rows."""
    def rows(r):
        return np.arange(2 * (r + 1), dtype=np.int32).reshape(r + 1, 2) + 100 * r

    def body():
        fn = lambda x: hvd.allgather(x, name="joined_gather")  # noqa: E731
        if mode == "function":
            fn = tf.function(fn)
        for _ in range(2):
            got = fn(tf.constant(rows(WORLD_RANK)))
            assert_exact(got, np.concatenate([rows(r) for r in active_ranks()]))
        got = hvd.grouped_allgather([tf.constant(rows(WORLD_RANK)),
                                     tf.constant(rows(WORLD_RANK)[:, 0] * 2)], name="joined_gg")
        assert_exact(got[0], np.concatenate([rows(r) for r in active_ranks()]))
        assert_exact(got[1], np.concatenate([rows(r)[:, 0] * 2 for r in active_ranks()]))

    joined_rank_0_runs(body)


@needs_two_ranks
@pytest.mark.parametrize("dtype", (tf.float32, tf.int32), ids=("float32", "int32"))
def test_min_max_product_while_a_rank_has_joined(dtype):
    """The joined rank contributes the identity, not zeros: Min of positive
    values, Max of negative values and Product stay what the active ranks give."""
    def value(r):
        return np.array([1, 2, 3], np.int64) * (r + 1)

    def factor(r):
        # Products of value() overflow int64 and leave float32's exact range at
        # 16 ranks; signs and a few 2s stay exact at any rank count, and a zero
        # or rank 0's own factor from the joined rank would still show.
        return np.array([1, -1 if r % 2 else 1, 2 if r < 8 else 1], np.int64)

    def body():
        active = np.stack([value(r) for r in active_ranks()])
        factors = np.stack([factor(r) for r in active_ranks()])
        nd = dtype.as_numpy_dtype
        x = tf.constant(value(WORLD_RANK), dtype)
        assert_exact(hvd.allreduce(x, op=hvd.Min, name="j_min"), active.min(0).astype(nd), "Min")
        assert_exact(hvd.allreduce(-x, op=hvd.Max, name="j_max"), (-active).max(0).astype(nd),
                     "Max")
        assert_exact(hvd.allreduce(tf.constant(factor(WORLD_RANK), dtype), op=hvd.Product,
                                   name="j_prod"), factors.prod(0).astype(nd), "Product")
        assert_exact(hvd.allreduce(x, op=hvd.Sum, name="j_sum"), active.sum(0).astype(nd), "Sum")
        if dtype == tf.float32:
            assert_exact(hvd.allreduce(x, op=hvd.Average, name="j_avg"),
                         active.sum(0).astype(nd) / nd(WORLD_SIZE), "Average")

    joined_rank_0_runs(body)


@needs_two_ranks
def test_reducescatter_alltoall_broadcast_barrier_while_a_rank_has_joined():
    """Zeros for the joined rank's reducescatter input; alltoall sends it rows that
    are dropped and receives none from it; broadcast from an active root works."""
    rows = 5

    def scatter_input(r):
        return (np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) % 4) + 2 * r

    def body():
        total = np.sum([scatter_input(r) for r in active_ranks()], axis=0)
        counts = [rows // WORLD_SIZE + (1 if r < rows % WORLD_SIZE else 0) for r in RANKS]
        start = sum(counts[:WORLD_RANK])
        block = slice(start, start + counts[WORLD_RANK])
        got = hvd.reducescatter(tf.constant(scatter_input(WORLD_RANK)), op=hvd.Sum, name="j_rs")
        assert_exact(got, total[block], "reducescatter Sum")
        got = hvd.reducescatter(tf.constant(scatter_input(WORLD_RANK)), op=hvd.Average,
                                name="j_rs_avg")
        assert_exact(got, total[block] / np.float32(WORLD_SIZE), "reducescatter Average")

        def splits(s):
            return [d + s for d in RANKS]  # 0.. rows to rank 0 (which has joined)

        def a2a_input(s):
            return np.arange(sum(splits(s)), dtype=np.int32) + 1000 * s

        out, received = hvd.alltoall(tf.constant(a2a_input(WORLD_RANK)),
                                     splits=splits(WORLD_RANK), name="j_a2a")
        parts = []
        for s in active_ranks():
            first = sum(splits(s)[:WORLD_RANK])
            parts.append(a2a_input(s)[first:first + splits(s)[WORLD_RANK]])
        assert_exact(out, np.concatenate(parts), "alltoall")
        assert_exact(received, np.array([0] + [splits(s)[WORLD_RANK] for s in active_ranks()],
                                        np.int64), "received_splits")

        got = hvd.broadcast(tf.constant([WORLD_RANK, 7]), root_rank=1, name="j_bcast")
        assert_exact(got, np.array([1, 7], np.int32), "broadcast from rank 1")
        hvd.barrier(name="j_barrier")

    joined_rank_0_runs(body)


@needs_two_ranks
def test_broadcast_from_a_joined_root_fails():
    """Rank 0 has joined, so it cannot be a broadcast root: the others get an error."""
    def body():
        with pytest.raises(tf.errors.FailedPreconditionError) as info:
            hvd.broadcast(tf.constant([1.0]), root_rank=0, name="j_bad_root").numpy()
        assert ("Cannot run broadcast of tensor 'j_bad_root': its root rank 0 has already "
                "called join().") in info.value.message, info.value.message
        good = hvd.allreduce(tf.constant([1]), op=hvd.Sum, name="j_after_bad_root")
        assert_exact(good, np.array([WORLD_SIZE - 1], np.int32))

    joined_rank_0_runs(body)

"""Process sets: collectives among some ranks, exact values per member.

The sets are the even and the odd ranks (disjoint, so both run at once under
the same op names), added dynamically once for the module. With one rank
there is no proper subset: only the registration errors are checked.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import MODES, WORLD_RANK, WORLD_SIZE, assert_exact, run

EVENS = list(range(0, WORLD_SIZE, 2))
ODDS = list(range(1, WORLD_SIZE, 2))
MINE = EVENS if WORLD_RANK % 2 == 0 else ODDS
needs_two = pytest.mark.skipif(WORLD_SIZE < 2, reason="a proper process set needs 2+ ranks")


@needs_two
def test_removed_set_is_gone_and_ids_keep_growing():
    """Runs first, before the module's sets exist: [0] is then free at any size."""
    temporary = hvd.add_process_set([0])
    set_id = temporary.process_set_id
    if temporary.included():
        assert int(hvd.allreduce(tf.constant(1), op=hvd.Sum, process_set=temporary)) == 1
    assert hvd.remove_process_set(temporary)
    assert temporary.process_set_id is None and not hvd.remove_process_set(temporary)
    again = hvd.add_process_set([0])
    assert again.process_set_id > set_id
    assert hvd.remove_process_set(again)


@pytest.fixture(scope="module")
def sets():
    """(evens, odds, this rank's set), added on every rank, removed at the end."""
    if WORLD_SIZE < 2:
        yield None
        return
    evens = hvd.add_process_set(hvd.ProcessSet(EVENS))
    odds = hvd.add_process_set(ODDS)
    mine = evens if WORLD_RANK % 2 == 0 else odds
    yield evens, odds, mine
    assert hvd.remove_process_set(odds) and hvd.remove_process_set(evens)


@needs_two
def test_registration(sets):
    evens, odds, mine = sets
    assert evens.process_set_id != odds.process_set_id and 0 not in (
        evens.process_set_id, odds.process_set_id)
    assert (evens.size(), odds.size()) == (len(EVENS), len(ODDS))
    assert mine.included() and not (odds if mine is evens else evens).included()
    assert mine.rank() == MINE.index(WORLD_RANK)
    assert (odds if mine is evens else evens).rank() is None
    assert hvd.global_process_set.ranks == list(range(WORLD_SIZE))
    assert int(hvd.size_op(process_set_id=odds.process_set_id).numpy()) == len(ODDS)


@needs_two
@pytest.mark.parametrize("mode", MODES)
def test_reductions_in_both_sets_at_once(sets, mode):
    """Both sets reduce under one name at once, beside a global op of that name."""
    _, _, mine = sets
    x = tf.constant([WORLD_RANK + 1.0, 10.0 * (WORLD_RANK + 1)])

    def body(t):
        total = hvd.allreduce(t, op=hvd.Sum, name="ps_same", process_set=mine)
        mean = hvd.allreduce(t, op=hvd.Average, name="ps_mean", process_set=mine)
        everyone = hvd.allreduce(t, op=hvd.Sum, name="ps_same")
        pair = hvd.grouped_allreduce([t, tf.cast(t, tf.int32)], op=hvd.Max,
                                     name="ps_grouped", process_set=mine)
        return total, mean, everyone, pair[0], pair[1]

    total, mean, everyone, biggest, biggest_int = run(mode, body, x)
    members = np.array([[r + 1.0, 10.0 * (r + 1)] for r in MINE], np.float32)
    assert_exact(total, members.sum(axis=0), "set Sum")
    assert_exact(mean, members.sum(axis=0) / len(MINE), "set Average")
    assert_exact(everyone, np.array([[r + 1.0, 10.0 * (r + 1)] for r in range(WORLD_SIZE)],
                                    np.float32).sum(axis=0), "global Sum")
    assert_exact(biggest, members.max(axis=0), "set Max")
    assert_exact(biggest_int, members.max(axis=0).astype(np.int32), "set Max int32")


@needs_two
@pytest.mark.parametrize("mode", MODES)
def test_moving_rows_within_a_set(sets, mode):
    _, _, mine = sets
    last = MINE[-1]  # a global rank, as in Horovod

    def body(t):
        b = hvd.broadcast(t, root_rank=last, name="ps_bcast", process_set=mine)
        g = hvd.allgather(tf.fill([WORLD_RANK + 1], WORLD_RANK), name="ps_gather",
                          process_set=mine)
        rows = tf.fill([2 * len(MINE), 2], float(WORLD_RANK))
        rs = hvd.reducescatter(rows, op=hvd.Sum, name="ps_rs", process_set=mine)
        a2a, got = hvd.alltoall(tf.range(len(MINE)) + 100 * WORLD_RANK,
                                splits=[1] * len(MINE), name="ps_a2a", process_set=mine)
        return b, g, rs, a2a, got

    b, g, rs, a2a, got = run(mode, body, tf.constant([WORLD_RANK, 7]))
    assert_exact(b, np.array([last, 7], np.int32), "broadcast from a member")
    assert_exact(g, np.concatenate([np.full(r + 1, r, np.int32) for r in MINE]), "allgather")
    assert_exact(rs, np.full((2, 2), float(sum(MINE)), np.float32), "reducescatter")
    me = MINE.index(WORLD_RANK)
    assert_exact(a2a, np.array([me + 100 * r for r in MINE], np.int32), "alltoall")
    assert_exact(got, np.ones(len(MINE), np.int64), "received splits")
    hvd.barrier(process_set=mine)


@needs_two
def test_objects_within_a_set(sets):
    _, _, mine = sets
    assert hvd.allgather_object({"rank": WORLD_RANK}, process_set=mine) == [
        {"rank": r} for r in MINE]
    assert hvd.broadcast_object(f"from {WORLD_RANK}", root_rank=MINE[0],
                                process_set=mine) == f"from {MINE[0]}"


@needs_two
@pytest.mark.parametrize("mode", MODES)
def test_gradients_within_a_set(sets, mode):
    """The allgather gradient sums over the set's members only, and a
    DistributedGradientTape on the set averages over its members."""
    _, _, mine = sets
    x = tf.constant([1.0, 2.0])

    def body(t):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(t)
            gathered = hvd.allgather(t, name="ps_grad_gather", process_set=mine)
            weights = tf.range(tf.shape(gathered)[0], dtype=tf.float32) * float(WORLD_RANK + 1)
            loss = tf.reduce_sum(gathered * weights)
            local = tf.reduce_sum(t) * float(WORLD_RANK + 1)
        dx = tape.gradient(loss, t)
        averaged = hvd.DistributedGradientTape(tape, process_set=mine, name="ps_tape")
        return dx, averaged.gradient(local, t)

    dx, avg = run(mode, body, x)
    me = MINE.index(WORLD_RANK)
    factor = sum(r + 1 for r in MINE)
    assert_exact(dx, np.array([2 * me, 2 * me + 1], np.float32) * factor, "allgather grad")
    assert_exact(avg, np.full(2, factor / len(MINE), np.float32), "tape average")


@needs_two
def test_misuse_is_a_clear_error_on_every_rank(sets):
    evens, odds, mine = sets
    other = odds if mine is evens else evens
    with pytest.raises(ValueError, match=f"Rank {WORLD_RANK} is not in process set"):
        hvd.allreduce(tf.ones([1]), process_set=other)
    outsider = next(r for r in range(WORLD_SIZE) if r not in MINE)
    with pytest.raises(ValueError, match=f"root_rank {outsider} is not in process set"):
        hvd.broadcast(tf.ones([1]), root_rank=outsider, process_set=mine)
    with pytest.raises(ValueError, match="has not been registered"):
        hvd.allreduce(tf.ones([1]), process_set=hvd.ProcessSet([0]))
    with pytest.raises(ValueError, match="every rank with the same ranks"):
        hvd.add_process_set([WORLD_RANK])
    with pytest.raises(ValueError, match="already registered"):
        hvd.add_process_set(list(reversed(EVENS)))


def test_registration_errors():
    with pytest.raises(ValueError, match="outside this job's ranks"):
        hvd.add_process_set([0, WORLD_SIZE])
    with pytest.raises(ValueError, match="already registered"):
        hvd.add_process_set(range(WORLD_SIZE))  # the global set
    with pytest.raises(ValueError, match="list a rank twice"):
        hvd.ProcessSet([0, 0])
    assert not hvd.remove_process_set(hvd.global_process_set)

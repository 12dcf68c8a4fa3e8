"""broadcast_object and allgather_object: any picklable object, any size.

Runs under mpiexec (see tests/test_collectives_mpi.py) with 1, 2 and 3 ranks.
Objects depend on the rank that made them and include closures, lambdas and
a class defined inside a function, which cloudpickle serialises by value, so
a rank that calls them runs the sender's code with the sender's captured
values. One test moves an object of more than 100 MB both ways.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import ROOTS, WORLD_RANK, WORLD_SIZE


def make_object(rank: int) -> dict:
    """A rank-dependent object with data, a closure, a lambda and a local class."""
    factor = 7 * rank + 3

    def scale(x):  # a closure: captures `factor` and `rank`
        return x * factor + rank

    class Point:  # defined here, so pickled by value
        def __init__(self, x, y):
            self.x, self.y = x, y

        def norm1(self):
            return abs(self.x) + abs(self.y) + rank

    return {
        "rank": rank,
        "name": f"rank-{rank}",
        "list": list(range(rank + 1)),
        "nested": {"tuple": (rank, None, "x" * rank), "set": {rank, -rank}},
        "array": np.arange(3 * rank, dtype=np.float32) + rank,
        "scale": scale,
        "shift": lambda y: y - rank,
        "point": Point(rank, -2 * rank),
    }


def check_object(got: dict, rank: int) -> None:
    """`got` is make_object(rank) (functions compared by what they compute)."""
    want = make_object(rank)
    where = f"object of rank {rank}, seen on rank {WORLD_RANK}"
    for key in ("rank", "name", "list", "nested"):
        assert got[key] == want[key], f"{where}: {key} = {got[key]!r}, expected {want[key]!r}"
    assert got["array"].dtype == np.float32, where
    assert np.array_equal(got["array"], want["array"]), where
    for x in (0, 1, 10, -3):
        assert got["scale"](x) == x * (7 * rank + 3) + rank, f"{where}: scale({x})"
        assert got["shift"](x) == x - rank, f"{where}: shift({x})"
    assert (got["point"].x, got["point"].y) == (rank, -2 * rank), where
    assert got["point"].norm1() == 4 * rank, where


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: f"root{r}")
def test_broadcast_object_from_every_root(root):
    """Non-root ranks pass None and get the root's object, closures included."""
    obj = make_object(root) if WORLD_RANK == root else None
    got = hvd.broadcast_object(obj, root_rank=root)
    if WORLD_RANK == root:
        assert got is obj  # the root keeps its own object
    check_object(got, root)


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: f"root{r}")
def test_broadcast_object_plain_values(root):
    """None, scalars and empty containers survive; non-roots' own objects are ignored."""
    for k, value in enumerate([None, 0, "", b"", [], {}, 3.5, ("a", 1), float("inf")]):
        mine = value if WORLD_RANK == root else ("not the root", WORLD_RANK)
        got = hvd.broadcast_object(mine, root_rank=root, name=f"plain_{k}")
        assert got == value and type(got) is type(value), f"{k}: {got!r} != {value!r}"


def test_allgather_object_rank_dependent():
    """Every rank gets every rank's object, in rank order."""
    got = hvd.allgather_object(make_object(WORLD_RANK))
    assert isinstance(got, list) and len(got) == WORLD_SIZE
    for rank, obj in enumerate(got):
        check_object(obj, rank)


def test_allgather_object_sizes_differ_per_rank():
    """Objects of very different pickled sizes, one of them tiny (None)."""
    def obj_of(rank):
        return None if rank == 0 else {"payload": "y" * (1000 * rank), "rank": rank}

    got = hvd.allgather_object(obj_of(WORLD_RANK), name="sizes")
    assert got == [obj_of(r) for r in range(WORLD_SIZE)]


def test_object_collectives_repeat_under_one_name():
    """The same (default) name used again and again, as a training loop would."""
    for step in range(5):
        got = hvd.allgather_object((WORLD_RANK, step))
        assert got == [(r, step) for r in range(WORLD_SIZE)]
        assert hvd.broadcast_object((step, "root") if WORLD_RANK == 0 else None) == (step, "root")


def test_object_collectives_refuse_tf_function():
    """They work on Python objects: inside a tf.function they fail while tracing."""
    @tf.function
    def bcast():
        return hvd.broadcast_object(1)

    @tf.function
    def gather():
        return hvd.allgather_object(1)

    for fn in (bcast, gather):
        with pytest.raises(RuntimeError, match="not inside a tf.function"):
            fn()


def test_object_collectives_in_tf1_graph_code():
    """TensorFlow 1 graph code (a graph and a session, as Horovod's tests use)
    gets the objects through the session."""
    with tf.Graph().as_default(), tf.compat.v1.Session():
        assert hvd.broadcast_object({"from": WORLD_RANK}, root_rank=0,
                                    name="graph_bcast_obj") == {"from": 0}
        assert hvd.allgather_object(WORLD_RANK * 2, name="graph_gather_obj") == [
            2 * r for r in range(WORLD_SIZE)]


BIG_BYTES = 100 * 2**20 + 12_345  # a bit over 100 MiB, not a round size


def big_array(rank: int) -> np.ndarray:
    """BIG_BYTES of uint8 with a rank-dependent, non-periodic-looking pattern."""
    out = np.resize(np.arange(251, dtype=np.uint8), BIG_BYTES)
    out += np.uint8(rank)
    return out


def test_object_over_100_mb_broadcast_and_allgathered():
    """A >100 MiB array from the last rank: broadcast to all, then allgathered
    (the last rank's entry is the big one; the others send small objects)."""
    big_rank = WORLD_SIZE - 1
    obj = {"rank": big_rank, "data": big_array(big_rank)} if WORLD_RANK == big_rank else None
    got = hvd.broadcast_object(obj, root_rank=big_rank, name="big_bcast")
    assert got["rank"] == big_rank
    assert got["data"].dtype == np.uint8 and got["data"].shape == (BIG_BYTES,)
    assert np.array_equal(got["data"], big_array(big_rank))
    del got
    gc.collect()

    mine = obj if WORLD_RANK == big_rank else {"rank": WORLD_RANK, "data": b"small"}
    gathered = hvd.allgather_object(mine, name="big_gather")
    assert [g["rank"] for g in gathered] == list(range(WORLD_SIZE))
    for r in range(WORLD_SIZE - 1):
        assert gathered[r]["data"] == b"small"
    assert np.array_equal(gathered[big_rank]["data"], big_array(big_rank))
    del gathered, obj, mine
    gc.collect()

"""Cross-rank mismatches of every collective, as one table.

Runs under mpiexec (see tests/test_collectives_mpi.py) with 2 and 3 ranks
(skipped with 1). In each case the ranks submit something different under
the same name, usually the last rank alone; the coordinator must fail the
collective on EVERY rank with a FailedPreconditionError whose message names
the tensor and what each rank sent (grouped as request_validation.cc formats it),
and the world must stay usable: the next allreduce and allgather succeed
with the right values.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import (WORLD_RANK, WORLD_SIZE, assert_exact, describe_by_rank,
                              last_rank_differs, needs_two_ranks)

IS_LAST = WORLD_RANK == WORLD_SIZE - 1
LAST = WORLD_SIZE - 1
GATHER_SHAPES = "Mismatched shapes (all dimensions but the first must match)"

pytestmark = needs_two_ranks


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """One case: what this rank submits under `name`, and the expected error."""

    name: str
    call: Callable[[], object]
    message: str


def _alltoall_splits(rows: int, splits_here, name: str):
    return lambda: hvd.alltoall(tf.zeros([rows, 2]), splits=splits_here, name=name)


def _other_kind(most: Callable, last: Callable) -> Callable:
    """`last` on the last rank, `most` on the others."""
    return last if IS_LAST else most


def _mismatch_inside_tf_function():
    fn = tf.function(lambda x: hvd.allreduce(x, op=hvd.Sum, name="bad_graph_shape"))
    return fn(tf.zeros([3, 3] if IS_LAST else [2, 3]))


def _negative_splits():
    rows = 2 * WORLD_SIZE
    splits = [2] * (WORLD_SIZE - 2) + [5, -1] if IS_LAST else [2] * WORLD_SIZE
    assert sum(splits) == rows
    return hvd.alltoall(tf.zeros([rows]), splits=splits, name="bad_splits_neg")


CASES = [
    # allreduce
    Mismatch("bad_shape",
             lambda: hvd.allreduce(tf.zeros([3, 3] if IS_LAST else [2, 3]), op=hvd.Sum,
                                   name="bad_shape"),
             "Mismatched shapes for allreduce of tensor 'bad_shape' across ranks: "
             + last_rank_differs("[2, 3]", "[3, 3]")),
    Mismatch("bad_dtype",
             lambda: hvd.allreduce(tf.zeros([4], tf.int32 if IS_LAST else tf.float32),
                                   op=hvd.Sum, name="bad_dtype"),
             "Mismatched data types for allreduce of tensor 'bad_dtype' across ranks: "
             + last_rank_differs("float32", "int32")),
    Mismatch("bad_op",
             lambda: hvd.allreduce(tf.ones([2]), op=hvd.Max if IS_LAST else hvd.Sum,
                                   name="bad_op"),
             "Mismatched reduction ops for allreduce of tensor 'bad_op' across ranks: "
             + last_rank_differs("Sum", "Max")),
    Mismatch("bad_prescale",
             lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum,
                                   prescale_factor=2.0 if IS_LAST else 1.0, name="bad_prescale"),
             "Mismatched scale factors for allreduce of tensor 'bad_prescale' across ranks: "
             + last_rank_differs("prescale 1 / postscale 1", "prescale 2 / postscale 1")),
    Mismatch("bad_postscale",
             lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum,
                                   postscale_factor=0.5 if IS_LAST else 1.0,
                                   name="bad_postscale"),
             "Mismatched scale factors for allreduce of tensor 'bad_postscale' across ranks: "
             + last_rank_differs("prescale 1 / postscale 1", "prescale 1 / postscale 0.5")),
    Mismatch("bad_count",
             lambda: hvd.grouped_allreduce([tf.ones([2]) for _ in range(3 if IS_LAST else 2)],
                                           op=hvd.Sum, name="bad_count"),
             "Mismatched tensor counts for allreduce of tensor 'bad_count' across ranks: "
             + last_rank_differs("2 tensor(s)", "3 tensor(s)")),
    Mismatch("bad_graph_shape", _mismatch_inside_tf_function,
             "Mismatched shapes for allreduce of tensor 'bad_graph_shape' across ranks: "
             + last_rank_differs("[2, 3]", "[3, 3]")),
    Mismatch("all_different",
             lambda: hvd.allreduce(tf.zeros([WORLD_RANK + 1]), op=hvd.Sum, name="all_different"),
             "Mismatched shapes for allreduce of tensor 'all_different' across ranks: "
             + describe_by_rank([f"[{r + 1}]" for r in range(WORLD_SIZE)])),
    # broadcast
    Mismatch("bad_root",
             lambda: hvd.broadcast(tf.ones([2]), root_rank=1 if IS_LAST else 0, name="bad_root"),
             "Mismatched root ranks for broadcast of tensor 'bad_root' across ranks: "
             + last_rank_differs("root 0", "root 1")),
    # different kinds of collective under one name
    Mismatch("bad_kind",
             _other_kind(lambda: hvd.allreduce(tf.ones([2]), op=hvd.Sum, name="bad_kind"),
                         lambda: hvd.broadcast(tf.ones([2]), root_rank=0, name="bad_kind")),
             "Mismatched operations for tensor 'bad_kind' across ranks: "
             + last_rank_differs("allreduce", "broadcast")),
    Mismatch("bad_kind_gather",
             _other_kind(lambda: hvd.allgather(tf.zeros([1]), name="bad_kind_gather"),
                         lambda: hvd.alltoall(tf.zeros([WORLD_SIZE]),
                                              name="bad_kind_gather")),
             "Mismatched operations for tensor 'bad_kind_gather' across ranks: "
             + last_rank_differs("allgather", "alltoall")),
    # allgather
    Mismatch("bad_gather_shape",
             lambda: hvd.allgather(tf.zeros([WORLD_RANK + 1, 4 if IS_LAST else 3]),
                                   name="bad_gather_shape"),
             f"{GATHER_SHAPES} for allgather of tensor 'bad_gather_shape' across ranks: "
             + last_rank_differs("[*, 3]", "[*, 4]")),
    Mismatch("bad_gather_ndims",
             lambda: hvd.allgather(tf.zeros([2, 3, 1] if IS_LAST else [2, 3]),
                                   name="bad_gather_ndims"),
             f"{GATHER_SHAPES} for allgather of tensor 'bad_gather_ndims' across ranks: "
             + last_rank_differs("[*, 3]", "[*, 3, 1]")),
    Mismatch("bad_gather_dtype",
             lambda: hvd.allgather(tf.zeros([2, 3], tf.int32 if IS_LAST else tf.float32),
                                   name="bad_gather_dtype"),
             "Mismatched data types for allgather of tensor 'bad_gather_dtype' across ranks: "
             + last_rank_differs("float32", "int32")),
    Mismatch("bad_gather_count",
             lambda: hvd.grouped_allgather([tf.ones([1, 2]) for _ in range(3 if IS_LAST else 2)],
                                           name="bad_gather_count"),
             "Mismatched tensor counts for allgather of tensor 'bad_gather_count' across ranks: "
             + last_rank_differs("2 tensor(s)", "3 tensor(s)")),
    # alltoall
    Mismatch("bad_splits_sum",
             _alltoall_splits(2 * WORLD_SIZE, [2] * (WORLD_SIZE - 1) + [3 if IS_LAST else 2],
                              "bad_splits_sum"),
             f"Invalid splits for alltoall of tensor 'bad_splits_sum': rank {LAST}'s splits add "
             f"up to {2 * WORLD_SIZE + 1} rows, but its tensor has {2 * WORLD_SIZE} rows."),
    Mismatch("bad_splits_len",
             lambda: hvd.alltoall(tf.zeros([2 * WORLD_SIZE]),
                                  splits=[2] * WORLD_SIZE + ([0] if IS_LAST else []),
                                  name="bad_splits_len"),
             f"Invalid splits for alltoall of tensor 'bad_splits_len': rank {LAST} gave "
             f"{WORLD_SIZE + 1} split(s), but the world has {WORLD_SIZE} rank(s); give one row "
             "count per rank."),
    Mismatch("bad_splits_neg", _negative_splits,
             f"Invalid splits for alltoall of tensor 'bad_splits_neg': rank {LAST} gave a "
             "negative row count -1."),
    Mismatch("bad_a2a_shape",
             lambda: hvd.alltoall(tf.zeros([WORLD_SIZE, 2 if IS_LAST else 3]),
                                  name="bad_a2a_shape"),
             f"{GATHER_SHAPES} for alltoall of tensor 'bad_a2a_shape' across ranks: "
             + last_rank_differs("[*, 3]", "[*, 2]")),
    # reducescatter
    Mismatch("bad_rs_shape",
             lambda: hvd.reducescatter(tf.zeros([5, 2] if IS_LAST else [4, 2]), op=hvd.Sum,
                                       name="bad_rs_shape"),
             "Mismatched shapes for reducescatter of tensor 'bad_rs_shape' across ranks: "
             + last_rank_differs("[4, 2]", "[5, 2]")),
    Mismatch("bad_rs_op",
             lambda: hvd.reducescatter(tf.ones([4]), op=hvd.Average if IS_LAST else hvd.Sum,
                                       name="bad_rs_op"),
             "Mismatched reduction ops for reducescatter of tensor 'bad_rs_op' across ranks: "
             + last_rank_differs("Sum", "Average")),
]


def assert_world_still_works(name: str) -> None:
    """Good collectives right after a failed one return the right values on every rank."""
    got = hvd.allreduce(tf.constant([WORLD_RANK + 1, 10]), op=hvd.Sum, name=f"{name}_after")
    assert_exact(got, np.array([WORLD_SIZE * (WORLD_SIZE + 1) // 2, 10 * WORLD_SIZE], np.int32))
    got = hvd.allgather(tf.constant([WORLD_RANK * 10 + 1]), name=f"{name}_gather_after")
    assert_exact(got, np.array([r * 10 + 1 for r in range(WORLD_SIZE)], np.int32))


def expect_failure(call, message: str) -> None:
    """`call()` raises FailedPreconditionError on this rank, with `message` in it."""
    with pytest.raises(tf.errors.FailedPreconditionError) as info:
        result = call()
        for t in (result if isinstance(result, (list, tuple)) else [result]):
            t.numpy()
    assert message in info.value.message, (
        f"rank {WORLD_RANK}: expected {message!r} in the error, got:\n{info.value.message}")


def test_every_case_has_its_own_name():
    assert len({case.name for case in CASES}) == len(CASES) == 21


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_mismatch_fails_on_every_rank_and_the_world_goes_on(case: Mismatch):
    expect_failure(case.call, case.message)
    assert_world_still_works(case.name)

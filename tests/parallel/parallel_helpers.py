"""Helpers shared by the per-rank test files in tests/parallel/.

These files run under ``mpiexec``: every rank runs the same pytest session, so
every test body (and every collective in it) runs on every rank in the same
order. Inputs depend on the rank; expected values are computed exactly in
numpy from what each rank contributed (every rank can rebuild every other
rank's input, since inputs are pure functions of the rank).
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

from hvdkeras.engine.agreement import describe_ranks

# Known at collection time (before hvdkeras.init()), so tests can be
# parametrized over the ranks: e.g. one test per broadcast root.
WORLD_SIZE = MPI.COMM_WORLD.Get_size()
WORLD_RANK = MPI.COMM_WORLD.Get_rank()
ROOTS = list(range(WORLD_SIZE))

ALLREDUCE_DTYPES = (tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.bfloat16,
                    tf.float32, tf.float64)
BROADCAST_DTYPES = ALLREDUCE_DTYPES + (tf.bool, tf.uint16, tf.int16, tf.uint32, tf.uint64)
FLOAT_DTYPES = tuple(d for d in ALLREDUCE_DTYPES if d.is_floating)
SHAPES = ((5,), (3, 4), (2, 3, 2))  # one of each rank 1, 2 and 3
MODES = ("eager", "function")

needs_two_ranks = pytest.mark.skipif(
    WORLD_SIZE < 2, reason="needs at least 2 ranks")


def ids(values: Iterable) -> list[str]:
    """Readable parametrize ids for dtypes and shapes."""
    out = []
    for v in values:
        if isinstance(v, tf.DType):
            out.append(v.name)
        elif isinstance(v, tuple):
            out.append("x".join(map(str, v)) or "scalar")
        else:
            out.append(str(v))
    return out


def run(mode: str, fn: Callable, *args):
    """Calls `fn(*args)` eagerly or through a fresh `tf.function`.

    Inputs are passed as arguments rather than created inside the function:
    in a graph they are then not constants that grappler could fold.
    """
    if mode == "eager":
        return fn(*args)
    if mode == "function":
        return tf.function(fn)(*args)
    raise ValueError(mode)


def np_dtype(dtype: tf.DType):
    """The numpy dtype of a TF dtype (ml_dtypes.bfloat16 for bfloat16)."""
    return np.dtype(dtype.as_numpy_dtype)


def as_dtype(values: np.ndarray, dtype: tf.DType) -> np.ndarray:
    """`values` (exact small numbers) converted to `dtype`'s numpy type."""
    if dtype == tf.bool:
        return np.asarray(values) != 0
    return np.asarray(values).astype(np_dtype(dtype))


def tensor(values: np.ndarray, dtype: tf.DType) -> tf.Tensor:
    return tf.constant(as_dtype(values, dtype), dtype=dtype)


def assert_exact(got, expected: np.ndarray, what: str = "") -> None:
    """`got` (a tensor or array) equals `expected` exactly, dtype and shape included."""
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    expected = np.asarray(expected)
    where = f"rank {WORLD_RANK}/{WORLD_SIZE}"
    label = f"{what} on {where}" if what else where
    assert got.dtype == expected.dtype, f"{label}: dtype {got.dtype}, expected {expected.dtype}"
    assert got.shape == expected.shape, f"{label}: shape {got.shape}, expected {expected.shape}"
    assert np.array_equal(got, expected), f"{label}:\n got {got!r}\n expected {expected!r}"


def describe_by_rank(values: Sequence[str]) -> str:
    """Per-rank values as request_validation.cc's DescribeByRank formats them.

    Ranks that sent the same value are grouped, in order of first appearance:
    "[2, 3] from ranks 0, 1; [3, 3] from rank 2".
    """
    groups: dict[str, list[int]] = {}
    for rank, value in enumerate(values):
        groups.setdefault(value, []).append(rank)
    return "; ".join(
        f"{value} from rank{'s' if len(ranks) > 1 else ''} {describe_ranks(ranks)}"
        for value, ranks in groups.items()
    )


def last_rank_differs(common: str, odd: str) -> str:
    """describe_by_rank where only the last rank sent `odd`."""
    return describe_by_rank([common] * (WORLD_SIZE - 1) + [odd])

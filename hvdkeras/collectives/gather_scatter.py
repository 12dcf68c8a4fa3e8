"""Collectives that move rows between ranks: allgather, alltoall and
reducescatter, with their grouped forms.

What may import this module: `hvdkeras.collectives` and the layers above it.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from hvdkeras.collectives import gradients  # noqa: F401  (registers the gradients of its ops)
from hvdkeras.collectives import kernels
from hvdkeras.collectives.common import (TensorLike, not_converted, per_dtype, resolve_op,
                                         to_tensors)
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Average, Sum


@not_converted
def allgather(tensor: TensorLike, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenates every rank's tensor along the first dimension.

    The first dimension may differ between ranks (a rank may contribute no
    rows); all other dimensions and the dtype must match.

    Args:
        tensor: A tensor with at least one dimension.
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all).

    Returns:
        A tensor with rank 0's rows first, then rank 1's, and so on (in a
        process set, in the order of the set's ranks).

    Example:

    ```python
    rows = hvd.allgather(tf.fill([hvd.rank() + 1, 2], hvd.rank()))
    ```
    """
    ps = process_sets.view(process_set)
    return kernels.allgather(to_tensors([tensor], "allgather", reducing=False, min_rank=1),
                             name, ps.set_id)[0]


@not_converted
def grouped_allgather(tensors: Sequence, name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Allgathers a list of tensors in one negotiated op per dtype.

    Args:
        tensors: Tensors, each with at least one dimension; each dtype
            present travels in one fused op (named `name`, `name_1`, ...).
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all).

    Returns:
        The gathered tensors, in input order.

    Example:

    ```python
    a, b = hvd.grouped_allgather([tf.ones([2, 3]), tf.zeros([1, 3])])
    ```
    """
    ps = process_sets.view(process_set)
    return grouped_allgather_mixed(tensors, name, ps.set_id)


def grouped_allgather_mixed(tensors: Sequence, name: Optional[str] = None,
                            process_set_id: int = 0) -> List[tf.Tensor]:
    """`grouped_allgather` on a set known by id: one fused op per dtype present."""
    converted = to_tensors(tensors, "grouped_allgather", reducing=False, min_rank=1)
    return per_dtype(converted, name or "HvdkerasGroupedAllgather",
                     lambda group, group_name: kernels.allgather(group, group_name,
                                                                 process_set_id))


def even_splits(rows, size: int) -> tf.Tensor:
    """Rows per rank when `rows` are spread as evenly as possible, lower ranks first."""
    rows = tf.cast(rows, tf.int64)
    base = rows // size
    extra = rows % size
    return base + tf.cast(tf.range(size, dtype=tf.int64) < extra, tf.int64)


@not_converted
def alltoall(tensor: TensorLike, splits: Optional[TensorLike] = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set
             ) -> Union[tf.Tensor, Tuple[tf.Tensor, tf.Tensor]]:
    """Sends `splits[r]` rows of `tensor` to rank r; returns what arrived.

    Args:
        tensor: A tensor with at least one dimension; its rows are sent in
            order: the first `splits[0]` to rank 0, the next to rank 1, ...
        splits: One non-negative row count per rank, summing to the number of
            rows. Default: equal blocks, which needs the number of rows to be
            a multiple of the number of ranks.
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all);
            `splits` then has one count per member, in the set's rank order.

    Returns:
        The rows received, ordered by sending rank; with `splits` given, the
        pair `(output, received_splits)`, the second saying how many rows
        came from each rank (Horovod's convention).

    Raises:
        tf.errors.InvalidArgumentError: without `splits`, when the number of
            rows is not a multiple of the number of ranks.

    Example:

    ```python
    out, counts = hvd.alltoall(tf.range(4), splits=[1, 3])  # with 2 ranks
    same_size = hvd.alltoall(tf.range(4))                    # 2 rows each
    ```
    """
    ps = process_sets.view(process_set)
    tensor = to_tensors([tensor], "alltoall", reducing=False, min_rank=1)[0]
    if splits is not None:
        splits = tf.cast(tf.convert_to_tensor(splits), tf.int64)
        return kernels.alltoall(tensor, splits, name, ps.set_id)
    rows = tf.shape(tensor, out_type=tf.int64)[0]
    check = tf.debugging.assert_equal(
        rows % ps.size, tf.constant(0, tf.int64),
        message=f"hvdkeras.alltoall without splits sends equal blocks, so the first dimension "
                f"must be a multiple of the {ps.size} ranks; pass splits= for uneven blocks")
    with tf.control_dependencies([check]):
        splits = even_splits(rows, ps.size)
    return kernels.alltoall(tensor, splits, name, ps.set_id)[0]


def _check_scatter_op(op: int) -> None:
    if op not in (Sum, Average):
        raise ValueError("hvdkeras.reducescatter supports op=hvdkeras.Sum or hvdkeras.Average.")


@not_converted
def reducescatter(tensor: TensorLike, name: Optional[str] = None, op: Optional[int] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Reduces a tensor over all ranks and keeps this rank's block of rows.

    With n rows and size ranks, rank r keeps n // size rows, plus one if
    r < n % size; blocks follow rank order.

    Args:
        tensor: A tensor of the same shape on every rank (at least 1-D).
        name: Name that matches this call across ranks.
        op: `hvdkeras.Average` (default) or `hvdkeras.Sum`.
        prescale_factor: Multiplies the input before the reduction.
        postscale_factor: Multiplies the result after the reduction.
        process_set: The `ProcessSet` whose ranks take part (default: all);
            blocks follow the set's rank order.

    Returns:
        This rank's rows of the reduced tensor.

    Example:

    ```python
    mine = hvd.reducescatter(tf.ones([4, 3]), op=hvd.Sum)  # 2 rows each on 2 ranks
    ```
    """
    ps = process_sets.view(process_set)
    op = resolve_op(op, None)
    _check_scatter_op(op)
    converted = to_tensors([tensor], "reducescatter", reducing=True, min_rank=1)
    return kernels.reducescatter(converted, op, prescale_factor, postscale_factor, name,
                                 ps.set_id)[0]


@not_converted
def grouped_reducescatter(tensors: Sequence, name: Optional[str] = None,
                          op: Optional[int] = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0,
                          process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """`reducescatter` of several tensors in one fused op per dtype.

    Args:
        tensors: Tensors (at least 1-D) with the same shapes on every rank.
        name: As in `reducescatter`.
        op: As in `reducescatter`.
        prescale_factor: As in `reducescatter`.
        postscale_factor: As in `reducescatter`.
        process_set: As in `reducescatter`.

    Returns:
        This rank's rows of each reduced tensor, in input order.

    Example:

    ```python
    a, b = hvd.grouped_reducescatter([tf.ones([4]), tf.ones([6, 2])])
    ```
    """
    ps = process_sets.view(process_set)
    op = resolve_op(op, None)
    _check_scatter_op(op)
    converted = to_tensors(tensors, "grouped_reducescatter", reducing=True, min_rank=1)
    return per_dtype(converted, name or "HvdkerasGroupedReducescatter",
                     lambda group, group_name: kernels.reducescatter(
                         group, op, prescale_factor, postscale_factor, group_name,
                         ps.set_id))

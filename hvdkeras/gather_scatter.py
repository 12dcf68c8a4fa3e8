"""Collectives that move rows between ranks: allgather, alltoall and
reducescatter (with their grouped forms and gradients)."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from hvdkeras import _library, basics
from hvdkeras.collectives import (Average, Sum, _ALLREDUCE_DTYPES, _BROADCAST_DTYPES,
                                  _check_dtype, _grad_name, _names, _not_converted,
                                  _one_consumer, _resolve_op, scale_values)


def _to_tensors(tensors: Sequence, what: str, allowed) -> List[tf.Tensor]:
    converted = [tf.convert_to_tensor(t) for t in tensors]
    for t in converted:
        _check_dtype(t, allowed, what)
        if t.shape.rank == 0:
            raise ValueError(f"hvdkeras.{what} needs tensors with at least one dimension; "
                             "reshape scalars to [1] first.")
    return converted


def _by_dtype(tensors: List[tf.Tensor]) -> List[List[int]]:
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return list(groups.values())


def _allgather_list(tensors: List[tf.Tensor], name: Optional[str]) -> List[tf.Tensor]:
    op_name, tensor_name = _names(name, "HvdkerasAllgather")
    return _one_consumer(
        _library.ops().hvdkeras_allgather(tensors, tensor_name=tensor_name, name=op_name))


@_not_converted
def allgather(tensor, name: Optional[str] = None) -> tf.Tensor:
    """Concatenates every rank's tensor along the first dimension.

    The first dimension may differ between ranks (a rank may contribute no
    rows); all other dimensions and the dtype must match.

    Args:
        tensor: A tensor with at least one dimension.
        name: Name that matches this call across ranks.

    Returns:
        A tensor with rank 0's rows first, then rank 1's, and so on.

    Example:

    ```python
    rows = hvd.allgather(tf.fill([hvd.rank() + 1, 2], hvd.rank()))
    ```
    """
    basics._require()
    return _allgather_list(_to_tensors([tensor], "allgather", _BROADCAST_DTYPES), name)[0]


@_not_converted
def grouped_allgather(tensors: Sequence, name: Optional[str] = None) -> List[tf.Tensor]:
    """Allgathers a list of tensors of one dtype in one negotiated, fused op.

    Args:
        tensors: Tensors of one dtype, each with at least one dimension.
        name: Name that matches this call across ranks.

    Returns:
        The gathered tensors, in input order.

    Example:

    ```python
    a, b = hvd.grouped_allgather([tf.ones([2, 3]), tf.zeros([1, 3])])
    ```
    """
    basics._require()
    converted = _to_tensors(tensors, "grouped_allgather", _BROADCAST_DTYPES)
    if len({t.dtype for t in converted}) > 1:
        raise TypeError("hvdkeras.grouped_allgather needs tensors of one dtype; got "
                        + ", ".join(sorted({t.dtype.name for t in converted})) + ".")
    return _allgather_list(converted, name) if converted else []


def grouped_allgather_mixed(tensors: Sequence, name: Optional[str] = None) -> List[tf.Tensor]:
    """Like `grouped_allgather`, with one fused op per dtype present."""
    converted = _to_tensors(tensors, "allgather", _BROADCAST_DTYPES)
    results: List[Optional[tf.Tensor]] = [None] * len(converted)
    base = name or "HvdkerasGroupedAllgather"
    for number, indices in enumerate(_by_dtype(converted)):
        outputs = _allgather_list([converted[i] for i in indices],
                                  base if number == 0 else f"{base}_{number}")
        for i, out in zip(indices, outputs):
            results[i] = out
    return results  # type: ignore[return-value]


def even_splits(rows, size: int) -> tf.Tensor:
    """Rows per rank when `rows` are spread as evenly as possible, lower ranks first."""
    rows = tf.cast(rows, tf.int64)
    base = rows // size
    extra = rows % size
    return base + tf.cast(tf.range(size, dtype=tf.int64) < extra, tf.int64)


@_not_converted
def alltoall(tensor, splits=None, name: Optional[str] = None) -> Tuple[tf.Tensor, tf.Tensor]:
    """Sends `splits[r]` rows of `tensor` to rank r; returns what arrived.

    Args:
        tensor: A tensor with at least one dimension; its rows are sent in
            order: the first `splits[0]` to rank 0, the next to rank 1, ...
        splits: One non-negative row count per rank, summing to the number of
            rows. Default: as even as possible, lower ranks getting the rest.
        name: Name that matches this call across ranks.

    Returns:
        `(output, received_splits)`: the rows received, ordered by sending
        rank, and how many came from each rank.

    Example:

    ```python
    out, counts = hvd.alltoall(tf.range(4), splits=[1, 3])  # with 2 ranks
    ```
    """
    basics._require()
    tensor = _to_tensors([tensor], "alltoall", _BROADCAST_DTYPES)[0]
    if splits is None:
        splits = even_splits(tf.shape(tensor, out_type=tf.int64)[0], basics.size())
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int64)
    op_name, tensor_name = _names(name, "HvdkerasAlltoall")
    output, received = _library.ops().hvdkeras_alltoall(
        tensor, splits, tensor_name=tensor_name, name=op_name)
    return output, received


def _reducescatter_list(tensors: List[tf.Tensor], op: int, prescale_factor: float,
                        postscale_factor: float, name: Optional[str]) -> List[tf.Tensor]:
    op_name, tensor_name = _names(name, "HvdkerasReducescatter")
    return _one_consumer(_library.ops().hvdkeras_reducescatter(
        tensors, reduce_op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, tensor_name=tensor_name, name=op_name))


def _check_scatter_op(op: int) -> None:
    if op not in (Sum, Average):
        raise ValueError("hvdkeras.reducescatter supports op=hvdkeras.Sum or hvdkeras.Average.")


@_not_converted
def reducescatter(tensor, name: Optional[str] = None, op: Optional[int] = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces a tensor over all ranks and keeps this rank's block of rows.

    With n rows and size ranks, rank r keeps n // size rows, plus one if
    r < n % size; blocks follow rank order.

    Args:
        tensor: A tensor of the same shape on every rank (at least 1-D).
        name: Name that matches this call across ranks.
        op: `hvdkeras.Average` (default) or `hvdkeras.Sum`.
        prescale_factor: Multiplies the input before the reduction.
        postscale_factor: Multiplies the result after the reduction.

    Returns:
        This rank's rows of the reduced tensor.

    Example:

    ```python
    mine = hvd.reducescatter(tf.ones([4, 3]), op=hvd.Sum)  # 2 rows each on 2 ranks
    ```
    """
    basics._require()
    op = _resolve_op(op, None)
    _check_scatter_op(op)
    converted = _to_tensors([tensor], "reducescatter", _ALLREDUCE_DTYPES)
    return _reducescatter_list(converted, op, prescale_factor, postscale_factor, name)[0]


@_not_converted
def grouped_reducescatter(tensors: Sequence, name: Optional[str] = None,
                          op: Optional[int] = None, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> List[tf.Tensor]:
    """`reducescatter` of several tensors in one fused op per dtype.

    Args:
        tensors: Tensors (at least 1-D) with the same shapes on every rank.
        name, op, prescale_factor, postscale_factor: As in `reducescatter`.

    Returns:
        This rank's rows of each reduced tensor, in input order.

    Example:

    ```python
    a, b = hvd.grouped_reducescatter([tf.ones([4]), tf.ones([6, 2])])
    ```
    """
    basics._require()
    op = _resolve_op(op, None)
    _check_scatter_op(op)
    converted = _to_tensors(tensors, "grouped_reducescatter", _ALLREDUCE_DTYPES)
    results: List[Optional[tf.Tensor]] = [None] * len(converted)
    base = name or "HvdkerasGroupedReducescatter"
    for number, indices in enumerate(_by_dtype(converted)):
        outputs = _reducescatter_list([converted[i] for i in indices], op, prescale_factor,
                                      postscale_factor, base if number == 0 else f"{base}_{number}")
        for i, out in zip(indices, outputs):
            results[i] = out
    return results  # type: ignore[return-value]


@tf.RegisterGradient("HvdkerasAllgather")
def _allgather_grad(op, *grads):
    """Every rank's output holds each input's rows: sum the gradients of all
    ranks' outputs, then keep this rank's rows."""
    from hvdkeras.collectives import _allreduce_list

    grads = [tf.convert_to_tensor(g) for g in grads]
    summed = _allreduce_list(grads, Sum, 1.0, 1.0, _grad_name(op))
    rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in op.inputs])
    all_rows = _allgather_list([rows[None, :]], _grad_name(op, suffix="grad_rows"))[0]  # [size, n]
    me = basics.rank()
    start = tf.reduce_sum(all_rows[:me], axis=0)
    return [g[start[i]:start[i] + rows[i]] for i, g in enumerate(summed)]


@tf.RegisterGradient("HvdkerasAlltoall")
def _alltoall_grad(op, grad, _received_grad):
    """Rows went from rank s to rank d: their gradients go back from d to s."""
    received = op.outputs[1]
    op_name, tensor_name = _names(_grad_name(op), "HvdkerasAlltoallGrad")
    back, _ = _library.ops().hvdkeras_alltoall(
        tf.convert_to_tensor(grad), received, tensor_name=tensor_name, name=op_name)
    return [back, None]


@tf.RegisterGradient("HvdkerasReducescatter")
def _reducescatter_grad(op, *grads):
    """Each input row fed one rank's output row: gather all output gradients."""
    reduce_op = op.get_attr("reduce_op")
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    if reduce_op == Average:
        scale /= basics.size()
    gathered = _allgather_list([tf.convert_to_tensor(g) for g in grads], _grad_name(op))
    return [scale_values(g, scale) for g in gathered]

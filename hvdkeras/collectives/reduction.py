"""Allreduce: reduce tensors over all ranks, every rank gets the result.

What may import this module: `hvdkeras.collectives` and the layers above it.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from hvdkeras.collectives import gradients  # noqa: F401  (registers the gradients of its ops)
from hvdkeras.collectives import kernels, sparse
from hvdkeras.collectives.adasum import adasum_allreduce
from hvdkeras.collectives.common import (TensorLike, check_dtype, not_converted, per_dtype, resolve_op,
                                         scale_values)
from hvdkeras.collectives.compression import Compression, Compressor
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, SetView, global_process_set
from hvdkeras.engine.types import Adasum


@not_converted
def allreduce(tensor: TensorLike, name: Optional[str] = None, average: Optional[bool] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: Optional[int] = None,
              compression: Compressor = Compression.none,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Reduces a tensor over all ranks; every rank gets the result.

    Args:
        tensor: A tensor (or anything convertible) of dtype uint8, int8, int32,
            int64, float16, bfloat16, float32 or float64, with the same shape
            on every rank. A `tf.IndexedSlices` (e.g. an Embedding gradient)
            is reduced by gathering every rank's values and indices, and
            comes back as `tf.IndexedSlices` (Sum or Average only); convert
            it with `tf.convert_to_tensor` first to reduce it densely.
        name: Name that matches this call across ranks (see Note
            [collective names] in `hvdkeras.collectives.common`).
        average: Deprecated spelling of `op` (True means Average).
        prescale_factor: Multiplies the input before the reduction.
        postscale_factor: Multiplies the result after the reduction.
        op: `hvdkeras.Average` (default), `Sum`, `Min`, `Max`, `Product` or
            `Adasum` (floating tensors; see `hvdkeras/collectives/adasum.py`).
            Average of integers rounds toward zero.
        compression: `hvdkeras.Compression.fp16` or `.bf16` sends floating
            tensors at half width and returns the result in the input's
            dtype (default `Compression.none`).
        process_set: The `ProcessSet` whose ranks take part (default: all
            ranks); Average divides by its size.

    Returns:
        A tensor like `tensor` holding the reduction.

    Example:

    ```python
    total = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)
    ```
    """
    ps = process_sets.view(process_set)
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return sparse.allreduce_indexed_slices(tensor, op, prescale_factor, postscale_factor,
                                               name, ps)
    tensor = tf.convert_to_tensor(tensor)
    check_dtype(tensor, "allreduce", reducing=True)
    wire, context = compression.compress(tensor)
    reduced = _reduce([wire], op, prescale_factor, postscale_factor, name or "HvdkerasAllreduce",
                      ps)[0]
    return compression.decompress(reduced, context)


def _reduce(tensors: List[tf.Tensor], op: int, prescale_factor: float, postscale_factor: float,
            name: Optional[str], ps: SetView) -> List[tf.Tensor]:
    """One fused allreduce of one dtype, or Adasum (computed above the engine)."""
    if op != Adasum:
        return kernels.allreduce(tensors, op, prescale_factor, postscale_factor, name, ps.set_id)
    scaled = [scale_values(t, prescale_factor) for t in tensors]
    return [scale_values(t, postscale_factor)
            for t in adasum_allreduce(scaled, name or "HvdkerasAdasum", ps)]


@not_converted
def grouped_allreduce(tensors: Sequence, name: Optional[str] = None,
                      average: Optional[bool] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, op: Optional[int] = None,
                      compression: Compressor = Compression.none,
                      process_set: ProcessSet = global_process_set) -> List[tf.Tensor]:
    """Reduces a list of tensors in one negotiated, fused operation.

    Tensors of one dtype are always reduced together in one buffer; each
    dtype present forms its own group (named `name`, `name_1`, ... in dtype
    order of first appearance).

    Args:
        tensors: A list of tensors (shapes may differ); `tf.IndexedSlices`
            among them are gathered as in `allreduce`.
        name: As in `allreduce`.
        average: As in `allreduce`.
        prescale_factor: As in `allreduce`.
        postscale_factor: As in `allreduce`.
        op: As in `allreduce`.
        compression: As in `allreduce`.
        process_set: As in `allreduce`.

    Returns:
        A list of reduced tensors, in input order.

    Example:

    ```python
    a, b = hvd.grouped_allreduce([tf.ones([2]), tf.zeros([3, 3])], op=hvd.Sum)
    ```
    """
    ps = process_sets.view(process_set)
    op = resolve_op(op, average)
    tensors = list(tensors)
    base = name or "HvdkerasGroupedAllreduce"
    sparse_at = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense_at = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    results: List = [None] * len(tensors)
    if sparse_at:  # gathered, not reduced: see `sparse`
        sparse_out = sparse.allreduce_slices_group(
            [tensors[i] for i in sparse_at], op, prescale_factor, postscale_factor,
            f"{base}.sparse", ps)
        for i, out in zip(sparse_at, sparse_out):
            results[i] = out
    converted = [tf.convert_to_tensor(tensors[i]) for i in dense_at]
    for t in converted:
        check_dtype(t, "grouped_allreduce", reducing=True)
    wire, contexts = zip(*[compression.compress(t) for t in converted]) if converted else ((), ())
    reduced = per_dtype(list(wire), base,
                        lambda group, group_name: _reduce(
                            group, op, prescale_factor, postscale_factor, group_name, ps))
    for i, r, c in zip(dense_at, reduced, contexts):
        results[i] = compression.decompress(r, c)
    return results

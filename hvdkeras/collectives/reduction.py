"""Allreduce: reduce tensors over all ranks, every rank gets the result.

What may import this module: `hvdkeras.collectives` and the layers above it.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from hvdkeras.collectives import kernels, sparse
from hvdkeras.collectives.common import check_dtype, not_converted, per_dtype, resolve_op
from hvdkeras.collectives.compression import Compression, Compressor
from hvdkeras.engine import world


@not_converted
def allreduce(tensor, name: Optional[str] = None, average: Optional[bool] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: Optional[int] = None,
              compression: Compressor = Compression.none) -> tf.Tensor:
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
        op: `hvdkeras.Average` (default), `Sum`, `Min`, `Max` or `Product`.
            Average of integers rounds toward zero.
        compression: `hvdkeras.Compression.fp16` or `.bf16` sends floating
            tensors at half width and returns the result in the input's
            dtype (default `Compression.none`).

    Returns:
        A tensor like `tensor` holding the reduction.

    Example:

    ```python
    total = hvd.allreduce(tf.constant([1.0, 2.0]), op=hvd.Sum)
    ```
    """
    world.require()
    op = resolve_op(op, average)
    if isinstance(tensor, tf.IndexedSlices):
        return sparse.allreduce_indexed_slices(tensor, op, prescale_factor, postscale_factor,
                                               name)
    tensor = tf.convert_to_tensor(tensor)
    check_dtype(tensor, "allreduce", reducing=True)
    wire, context = compression.compress(tensor)
    reduced = kernels.allreduce([wire], op, prescale_factor, postscale_factor, name)[0]
    return compression.decompress(reduced, context)


@not_converted
def grouped_allreduce(tensors: Sequence, name: Optional[str] = None,
                      average: Optional[bool] = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, op: Optional[int] = None,
                      compression: Compressor = Compression.none) -> List[tf.Tensor]:
    """Reduces a list of tensors in one negotiated, fused operation.

    Tensors of one dtype are always reduced together in one buffer; each
    dtype present forms its own group (named `name`, `name_1`, ... in dtype
    order of first appearance).

    Args:
        tensors: A list of tensors (shapes may differ).
        name, average, prescale_factor, postscale_factor, op, compression: As in
            `allreduce`.

    Returns:
        A list of reduced tensors, in input order.

    Example:

    ```python
    a, b = hvd.grouped_allreduce([tf.ones([2]), tf.zeros([3, 3])], op=hvd.Sum)
    ```
    """
    world.require()
    op = resolve_op(op, average)
    converted = [tf.convert_to_tensor(t) for t in tensors]
    for t in converted:
        check_dtype(t, "grouped_allreduce", reducing=True)
    wire, contexts = zip(*[compression.compress(t) for t in converted]) if converted else ((), ())
    reduced = per_dtype(list(wire), name or "HvdkerasGroupedAllreduce",
                        lambda group, group_name: kernels.allreduce(
                            group, op, prescale_factor, postscale_factor, group_name))
    return [compression.decompress(r, c) for r, c in zip(reduced, contexts)]

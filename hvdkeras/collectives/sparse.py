"""Reducing `tf.IndexedSlices` (sparse gradients such as Embedding's) by
gathering every rank's rows: duplicates add up, as one process would see them.

What may import this module: the rest of `hvdkeras.collectives`,
`hvdkeras.training.gradient_reduction` and `hvdkeras.sharding` (whose
sharded weights take their rows of the gathered slices).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

from hvdkeras.collectives.common import scale_values
from hvdkeras.collectives.gather_scatter import grouped_allgather_mixed
from hvdkeras.engine.process_sets import SetView
from hvdkeras.engine.types import ALL_REDUCE_OP_NAMES, Average, Sum


def gather_slices(slices: Sequence[tf.IndexedSlices], name: str,
                  process_set_id: int = 0) -> List[tf.IndexedSlices]:
    """Every rank's rows of each `tf.IndexedSlices`, concatenated (unscaled).

    All values and indices travel in one fused allgather per dtype.
    """
    gathered = grouped_allgather_mixed(
        [s.values for s in slices] + [s.indices for s in slices], name=name,
        process_set_id=process_set_id)
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape)
            for s, v, i in zip(slices, gathered[:len(slices)], gathered[len(slices):])]


def sparse_scale(op: int, prescale_factor: float, postscale_factor: float,
                 set_size: int) -> float:
    """The factor applied to gathered rows: duplicates add up, so Sum is 1.

    Min, Max and Product have no meaning for rows that are concatenated, not
    combined: NotImplementedError, as in Horovod.
    """
    if op not in (Sum, Average):
        raise NotImplementedError(
            f"allreduce of tf.IndexedSlices supports Sum and Average, not "
            f"{ALL_REDUCE_OP_NAMES[op]}; densify with tf.convert_to_tensor first.")
    scale = prescale_factor * postscale_factor
    return scale / set_size if op == Average else scale


def allreduce_indexed_slices(slices: tf.IndexedSlices, op: int, prescale_factor: float,
                             postscale_factor: float, name: Optional[str],
                             ps: SetView) -> tf.IndexedSlices:
    """Sum/Average of sparse rows: every rank's rows, concatenated (duplicates add up)."""
    return allreduce_slices_group([slices], op, prescale_factor, postscale_factor,
                                  name or "HvdkerasSparseAllreduce", ps)[0]


def allreduce_slices_group(slices: Sequence[tf.IndexedSlices], op: int, prescale_factor: float,
                           postscale_factor: float, name: str,
                           ps: SetView) -> List[tf.IndexedSlices]:
    """`allreduce_indexed_slices` of several slices, gathered in one fused op per dtype.

    An Average of integer rows comes back as floats (TensorFlow's true
    division, as in Horovod); a cast back would round every row to zero or one.
    """
    scale = sparse_scale(op, prescale_factor, postscale_factor, ps.size)
    out = []
    for gathered in gather_slices(slices, name, ps.set_id):
        values, factor = gathered.values, scale
        if values.dtype.is_integer and op == Average:
            # TensorFlow's true division (float32 for 8/16-bit integers,
            # float64 for 32/64-bit), as Horovod divides.
            values = tf.math.truediv(values, tf.cast(ps.size, values.dtype))
            factor = prescale_factor * postscale_factor
        out.append(tf.IndexedSlices(scale_values(values, factor), gathered.indices,
                                    dense_shape=gathered.dense_shape))
    return out


def reduce_slices(slices: Sequence[tf.IndexedSlices], wire_op: int, prescale: float,
                  postscale: float, compress: Callable[[tf.Tensor], Any],
                  decompress: Callable[[tf.Tensor, Any], tf.Tensor], name: str,
                  ps: SetView) -> List[tf.IndexedSlices]:
    """Sparse gradients reduced by gathering: every rank's rows of each, in
    rank order, their values compressed on the wire and then scaled, so the
    optimizer sees what one process would on the global batch, repeated rows
    included (Keras's Adam squares each row before summing repeats, so a
    densified sum would give other weights)."""
    scale = sparse_scale(wire_op, prescale, postscale, ps.size)
    packed = [compress(s.values) for s in slices]
    gathered = gather_slices([tf.IndexedSlices(p[0], s.indices, dense_shape=s.dense_shape)
                              for s, p in zip(slices, packed)], name, ps.set_id)
    return [tf.IndexedSlices(scale_values(decompress(g.values, p[1]), scale), g.indices,
                             dense_shape=g.dense_shape)
            for g, p in zip(gathered, packed)]


def rows_of_slices(slices: tf.IndexedSlices, begin: int, end: int) -> tf.IndexedSlices:
    """The entries of `slices` in rows [begin, end), renumbered from 0, in
    their order (repeats kept): the gradient of a variable holding those rows."""
    inside = tf.logical_and(slices.indices >= begin, slices.indices < end)
    rest = slices.values.shape[1:]
    if rest.is_fully_defined():
        shape = tf.constant([end - begin] + rest.as_list(), slices.indices.dtype)
    else:
        shape = tf.cast(tf.concat([[end - begin], tf.shape(slices.values, out_type=tf.int64)[1:]],
                                  0), slices.indices.dtype)
    return tf.IndexedSlices(tf.boolean_mask(slices.values, inside),
                            tf.boolean_mask(slices.indices, inside) - begin, dense_shape=shape)

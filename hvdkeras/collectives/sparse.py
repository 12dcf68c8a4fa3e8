"""Reducing `tf.IndexedSlices` (sparse gradients such as Embedding's) by
gathering every rank's rows: duplicates add up, as one process would see them
(Note [sparse gradients at every rank count]).

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
    """Sparse gradients reduced as one process on the global batch would
    see them (Note [sparse gradients at every rank count]): every rank's rows
    of each, in rank order, their values compressed on the wire and then
    scaled, except that a lookup every rank made with the same rows (a
    position table read with `arange`) has its ranks' values added row by
    row, as one process's backward pass adds them over the batch."""
    scale = sparse_scale(wire_op, prescale, postscale, ps.size)
    packed = [compress(s.values) for s in slices]
    counts = [tf.reshape(tf.size(s.indices, out_type=s.indices.dtype), [1]) for s in slices]
    gathered = grouped_allgather_mixed(
        [p[0] for p in packed] + [s.indices for s in slices] + counts, name=name,
        process_set_id=ps.set_id)
    k = len(slices)
    out = []
    for s, p, values, indices, all_counts in zip(slices, packed, gathered[:k],
                                                  gathered[k:2 * k], gathered[2 * k:]):
        values = scale_values(decompress(values, p[1]), scale)
        values, indices = merge_identical_lookups(values, indices, all_counts, ps.size)
        out.append(tf.IndexedSlices(values, indices, dense_shape=s.dense_shape))
    return out


def merge_identical_lookups(values: tf.Tensor, indices: tf.Tensor, counts: tf.Tensor,
                            size: int):
    """Gathered rows with each rank's repeated lookup added up.

    Note [sparse gradients at every rank count]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    Keras 3's optimizers take a `tf.IndexedSlices` gradient slice by slice:
    Adam, for one, squares each slice's values before it adds the repeats
    of a row. So what a step does depends on how the gradient is cut into
    slices, and N ranks match one process only if they hand the optimizer
    the slices one process would have made. Two kinds of lookup make them:
    - rows picked by the batch (token ids): one slice per occurrence, at
      any rank count, so one process's slices are all ranks' slices
      together. Gathering them gives exactly those.
    - rows picked the same for the whole batch (a position or segment
      table read with `arange(maxlen)` and broadcast over the batch): the
      backward pass adds the batch's gradients before the lookup's, so one
      process makes one slice per row, summed over the global batch, and
      every rank makes the same rows with its part of that sum. Gathering
      would hand the optimizer N part-slices per row (for Adam, the sum of
      the parts' squares, not the square of their sum).
    Every rank's indices and their count travel with the values, so every
    rank sees the same gathered rows and takes the same decision: when all
    ranks sent the same indices in the same order, their values are added
    row by row (in rank order) and the optimizer gets one rank's indices
    with the sums, as from one process; otherwise the rows stay as
    gathered. A gradient that mixes both kinds in one variable (a table
    read by the batch and also by `arange`) keeps its gathered rows, and
    per-batch lookups whose ids happen to be identical on every rank in a
    step are added (as a dense gradient would be); docs/keras-training.md
    says so.

    Args:
        values: The gathered values, rank 0's rows first.
        indices: The gathered indices, in the same order.
        counts: How many rows each rank sent (one entry per rank).
        size: The number of ranks that sent rows.

    Returns:
        `(values, indices)`: as given, or each rank's shared rows summed.
    """
    if size == 1:
        return values, indices
    first = counts[0]
    rows = values.shape[1:]

    def identical() -> tf.Tensor:
        per_rank = tf.reshape(indices, tf.stack([tf.constant(size, first.dtype), first]))
        return tf.reduce_all(tf.equal(per_rank, per_rank[:1]))

    same = tf.cond(tf.reduce_all(tf.equal(counts, first)), identical,
                   lambda: tf.constant(False))

    def summed():
        shape = tf.concat([tf.stack([tf.constant(size, tf.int64), tf.cast(first, tf.int64)]),
                           tf.shape(values, out_type=tf.int64)[1:]], 0)
        return tf.reduce_sum(tf.reshape(values, shape), 0), indices[:first]

    merged_values, merged_indices = tf.cond(same, summed, lambda: (values, indices))
    merged_values.set_shape(tf.TensorShape([None]).concatenate(rows))
    merged_indices.set_shape([None])
    return merged_values, merged_indices


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

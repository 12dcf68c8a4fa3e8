"""Reducing `tf.IndexedSlices` (sparse gradients such as Embedding's) by
gathering every rank's rows: duplicates add up, as one process would see them.

What may import this module: the rest of `hvdkeras.collectives`, and
`hvdkeras.training.gradient_reduction`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from hvdkeras.collectives.common import scale_values
from hvdkeras.collectives.gather_scatter import grouped_allgather_mixed
from hvdkeras.engine import world
from hvdkeras.engine.types import REDUCE_OP_NAMES, Average, Sum


def gather_slices(slices: Sequence[tf.IndexedSlices], name: str) -> List[tf.IndexedSlices]:
    """Every rank's rows of each `tf.IndexedSlices`, concatenated (unscaled).

    All values and indices travel in one fused allgather per dtype.
    """
    gathered = grouped_allgather_mixed(
        [s.values for s in slices] + [s.indices for s in slices], name=name)
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape)
            for s, v, i in zip(slices, gathered[:len(slices)], gathered[len(slices):])]


def sparse_scale(op: int, prescale_factor: float, postscale_factor: float) -> float:
    """The factor applied to gathered rows: duplicates add up, so Sum is 1."""
    if op not in (Sum, Average):
        raise ValueError(f"allreduce of tf.IndexedSlices supports Sum and Average, not "
                         f"{REDUCE_OP_NAMES[op]}; densify with tf.convert_to_tensor first.")
    scale = prescale_factor * postscale_factor
    return scale / world.size() if op == Average else scale


def allreduce_indexed_slices(slices: tf.IndexedSlices, op: int, prescale_factor: float,
                             postscale_factor: float,
                             name: Optional[str]) -> tf.IndexedSlices:
    """Sum/Average of sparse rows: every rank's rows, concatenated (duplicates add up)."""
    scale = sparse_scale(op, prescale_factor, postscale_factor)
    gathered = gather_slices([slices], name or "HvdkerasSparseAllreduce")[0]
    return tf.IndexedSlices(scale_values(gathered.values, scale), gathered.indices,
                            dense_shape=gathered.dense_shape)

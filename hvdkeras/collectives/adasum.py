"""Adasum, Horovod's adaptive summation of gradients, on the CPU.

For two ranks' gradients a and b, Adasum is

    (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

per tensor: orthogonal gradients add up, parallel ones average, so a larger
world needs no learning-rate retuning. More ranks combine in a binary tree,
neighbours first (ranks 0+1, 2+3, then the pairs), the order of Horovod's
vector-halving, distance-doubling implementation; an unpaired rank at a
level (world sizes that are not powers of two, which Horovod refuses) moves
up unchanged. The dot products are taken in float64.

This version gathers every rank's tensors and runs the tree on every rank,
so all ranks get the same result from the same arithmetic. It moves size x
more bytes than Horovod's and suits the modest tensors and world sizes of
one host; it is exact rather than fast.

What may import this module: the rest of `hvdkeras.collectives`, and
`hvdkeras.training.gradient_reduction`.
"""

from __future__ import annotations

from typing import List, Sequence

import tensorflow as tf

from hvdkeras.collectives.gather_scatter import grouped_allgather_mixed
from hvdkeras.engine.process_sets import SetView


def combine(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    """The Adasum of two float64 tensors (a zero tensor leaves the other as is)."""
    dot = tf.reduce_sum(a * b)
    a_norm = tf.reduce_sum(a * a)
    b_norm = tf.reduce_sum(b * b)
    one = tf.constant(1.0, tf.float64)
    a_coef = tf.where(a_norm > 0, one - dot / (2.0 * tf.maximum(a_norm, 1e-300)), one)
    b_coef = tf.where(b_norm > 0, one - dot / (2.0 * tf.maximum(b_norm, 1e-300)), one)
    return a_coef * a + b_coef * b


def tree(values: Sequence[tf.Tensor]) -> tf.Tensor:
    """Combines values pairwise, neighbours first, up to one."""
    level = list(values)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def check_adasum_dtype(tensor: tf.Tensor) -> None:
    if not tensor.dtype.is_floating:
        raise ValueError(f"Adasum combines floating-point tensors; got {tensor.dtype.name}.")


def adasum_allreduce(tensors: List[tf.Tensor], name: str, ps: SetView) -> List[tf.Tensor]:
    """The Adasum over the set's ranks of each tensor (same shapes on every rank)."""
    for t in tensors:
        check_adasum_dtype(t)
    gathered = grouped_allgather_mixed([tf.expand_dims(t, 0) for t in tensors], name, ps.set_id)
    out = []
    for t, rows in zip(tensors, gathered):
        wide = tf.cast(rows, tf.float64)
        out.append(tf.cast(tree([wide[i] for i in range(ps.size)]), t.dtype))
    return out

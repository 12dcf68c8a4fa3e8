"""The collectives of a sharded optimizer step: gradients to their owners
(reduce-scatter, ZeRO stage 2) and updated weights back to every rank (a
broadcast from each owner, stages 1 and 2).

The reduce-scatter works on one flat buffer per dtype laid out by
`plan.plan_blocks`: one block per rank, holding that rank's variables one
after another, padded to the longest block. The weights travel as one fused
broadcast per owner, whose outputs are the variables' own tensors (no flat
buffer to cut up again). Under XLA (Note [xla collectives]) the reduce-scatter
has no compiled form and XLA orders the custom calls itself: there the
gradients are allreduced and each rank keeps its own (as they are wherever
the blocks are too uneven for a reduce-scatter to pay), and the weights travel
as one allreduce of values that are zero where another rank owns: the same
values, at about twice the bytes.

What may import this module: `hvdkeras.sharding`.
"""

from __future__ import annotations

from typing import Dict, Hashable, Mapping

import tensorflow as tf

from hvdkeras.collectives import kernels
from hvdkeras.collectives.reduction import grouped_allreduce
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet
from hvdkeras.engine.types import Sum
from hvdkeras.sharding.plan import Blocks, by_dtype, plan_blocks


def _flat(tensor) -> tf.Tensor:
    return tf.reshape(tf.convert_to_tensor(tensor), [-1])


def _unpack(flat: tf.Tensor, blocks: Blocks, rank: int, start: int,
            shapes: Dict[Hashable, tf.TensorShape]) -> Dict[Hashable, tf.Tensor]:
    out = {}
    for p, offset in zip(blocks.members[rank], blocks.offsets[rank]):
        size = shapes[p].num_elements()
        out[p] = tf.reshape(flat[start + offset:start + offset + size], shapes[p])
    return out


def pads_little(blocks: Blocks, world_size: int) -> bool:
    """Whether a reduce-scatter of `blocks` pads the ranks' blocks by less
    than half of what it moves. Otherwise (whole variables that could not
    be balanced, as in one of stage 3's groups) an allreduce of which each
    rank keeps its own moves fewer bytes: every block would be padded to
    the fullest one's."""
    return blocks.padded * world_size <= 1.5 * sum(blocks.lengths)


def reduce_scatter_to_owners(gradients: Dict[Hashable, tf.Tensor], owners: Mapping[Hashable, int],
                             rank: int, world_size: int, name: str, op: int,
                             prescale: float, postscale: float,
                             process_set: ProcessSet) -> Dict[Hashable, tf.Tensor]:
    """Reduces dense gradients across ranks; each rank gets its own only.

    Args:
        gradients: Dense gradients by unit (`ShardState.units`: sortable keys),
            the same units and shapes on every rank (replicated positions
            must be left out).
        owners: Each unit's owner.
        rank: This rank's position in the process set.
        world_size: The process set's size.
        name: Collective name prefix, the same on every rank.
        op: The wire op (Sum or Average).
        prescale: Multiplies every gradient before the reduction.
        postscale: Multiplies the result.
        process_set: The ranks that share the state.

    Returns:
        The reduced gradients of the positions `rank` owns.
    """
    shapes = {p: g.shape for p, g in gradients.items()}
    result: Dict[Hashable, tf.Tensor] = {}
    groups = by_dtype(sorted(gradients), lambda p: gradients[p].dtype)
    for number, (dtype, positions) in enumerate(groups.items()):
        blocks = plan_blocks(positions, {p: shapes[p].num_elements() for p in positions},
                             owners, world_size)
        group_name = name if number == 0 else f"{name}_{number}"
        if kernels.in_xla() or not pads_little(blocks, world_size):
            reduced = dict(zip(positions, grouped_allreduce(
                [gradients[p] for p in positions], name=group_name, op=op,
                prescale_factor=prescale, postscale_factor=postscale, process_set=process_set)))
            result.update((p, reduced[p]) for p in blocks.members[rank])
            continue
        if blocks.padded == 0:
            continue
        parts = []
        for r in range(world_size):
            parts += [_flat(gradients[p]) for p in blocks.members[r]]
            if blocks.padded > blocks.lengths[r]:
                parts.append(tf.zeros([blocks.padded - blocks.lengths[r]], dtype))
        buffer = tf.concat(parts, 0)
        mine = kernels.reducescatter([buffer], op, prescale, postscale, group_name,
                                     process_sets.view(process_set).set_id)[0]
        result.update(_unpack(mine, blocks, rank, 0, shapes))
    return result


def broadcast_from_owners(values: Dict[Hashable, tf.Tensor], owners: Mapping[Hashable, int],
                          rank: int, world_size: int, name: str,
                          process_set: ProcessSet) -> Dict[Hashable, tf.Tensor]:
    """Every rank's variables, from the ranks that own them: one fused
    broadcast per owner (and dtype), each variable a tensor of its own.

    Args:
        values: The current value of every unit to share, by sortable key (a
            rank's own are sent; the others only give the shapes).
        owners: Each unit's owner.
        rank: This rank's position in the process set.
        world_size: The process set's size.
        name: Collective name prefix, the same on every rank.
        process_set: The ranks that share the state.

    Returns:
        The received value of every position (this rank's own included:
        see `ShardedOptimizerMixin._hvdkeras_share_weights`).
    """
    if kernels.in_xla():
        # XLA runs its custom calls one after another in an order of its own,
        # so several broadcasts could wait on each other across ranks: one
        # allreduce (Sum) of values that are zero where another rank owns.
        positions = sorted(values)
        summed = grouped_allreduce(
            [values[p] if owners[p] == rank else tf.zeros_like(values[p]) for p in positions],
            name=name, op=Sum, process_set=process_set)
        return dict(zip(positions, summed))
    set_id = process_sets.view(process_set).set_id
    result: Dict[Hashable, tf.Tensor] = {}
    for owner in range(world_size):
        mine = [p for p in sorted(values) if owners[p] == owner]
        groups = by_dtype(mine, lambda p: values[p].dtype)
        for number, positions in enumerate(groups.values()):
            suffix = "" if number == 0 else f"_{number}"
            received = kernels.broadcast([values[p] for p in positions], owner,
                                         f"{name}_from{owner}{suffix}", set_id)
            result.update(zip(positions, received))
    return result

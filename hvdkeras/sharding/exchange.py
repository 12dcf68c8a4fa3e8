"""The collectives of a sharded optimizer step: gradients to their owners
(reduce-scatter, ZeRO stage 2) and updated weights back to every rank
(allgather, stages 1 and 2).

Both work on flat buffers laid out by `plan.plan_blocks`: one block per rank,
holding that rank's variables one after another, so one fused collective per
dtype moves everything. Under XLA (Note [xla collectives]) only the allreduce
has a compiled form: there the gradients are allreduced and each rank keeps
its part, and the weights travel as an allreduce (Sum) of buffers that are
zero outside each rank's own block. Both give the same values, at about
twice the bytes.

What may import this module: `hvdkeras.sharding`.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

import tensorflow as tf

from hvdkeras.collectives import kernels
from hvdkeras.collectives.gather_scatter import grouped_allgather_mixed
from hvdkeras.collectives.reduction import grouped_allreduce
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet
from hvdkeras.engine.types import Sum
from hvdkeras.sharding.plan import Blocks, plan_blocks


def _by_dtype(positions: Sequence[int], dtype_of: Callable[[int], tf.DType]
              ) -> Dict[tf.DType, List[int]]:
    """Positions grouped by dtype, groups in order of first appearance."""
    groups: Dict[tf.DType, List[int]] = {}
    for p in positions:
        groups.setdefault(dtype_of(p), []).append(p)
    return groups


def _flat(tensor) -> tf.Tensor:
    return tf.reshape(tf.convert_to_tensor(tensor), [-1])


def _block(blocks: Blocks, rank: int, values: Dict[int, tf.Tensor], dtype: tf.DType,
           pad_to: Optional[int] = None) -> tf.Tensor:
    """Rank `rank`'s block as one flat tensor (zero-padded to `pad_to`)."""
    parts = [_flat(values[p]) for p in blocks.members[rank]]
    if pad_to is not None and pad_to > blocks.lengths[rank]:
        parts.append(tf.zeros([pad_to - blocks.lengths[rank]], dtype))
    if not parts:
        return tf.zeros([0], dtype)
    return parts[0] if len(parts) == 1 else tf.concat(parts, 0)


def _unpack(flat: tf.Tensor, blocks: Blocks, rank: int, start: int,
            shapes: Dict[int, tf.TensorShape]) -> Dict[int, tf.Tensor]:
    out = {}
    for p, offset in zip(blocks.members[rank], blocks.offsets[rank]):
        size = shapes[p].num_elements()
        out[p] = tf.reshape(flat[start + offset:start + offset + size], shapes[p])
    return out


def reduce_scatter_to_owners(gradients: Dict[int, tf.Tensor], owners: Sequence[int],
                             rank: int, world_size: int, name: str, op: int,
                             prescale: float, postscale: float,
                             process_set: ProcessSet) -> Dict[int, tf.Tensor]:
    """Reduces dense gradients across ranks; each rank gets its own only.

    Args:
        gradients: Dense gradients by variable position, the same positions
            and shapes on every rank (replicated positions must be left out).
        owners: The plan (`plan.plan_owners`).
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
    result: Dict[int, tf.Tensor] = {}
    groups = _by_dtype(sorted(gradients), lambda p: gradients[p].dtype)
    for number, (dtype, positions) in enumerate(groups.items()):
        blocks = plan_blocks(positions, {p: shapes[p].num_elements() for p in positions},
                             owners, world_size)
        group_name = name if number == 0 else f"{name}_{number}"
        if kernels.in_xla():
            reduced = dict(zip(positions, grouped_allreduce(
                [gradients[p] for p in positions], name=group_name, op=op,
                prescale_factor=prescale, postscale_factor=postscale, process_set=process_set)))
            result.update((p, reduced[p]) for p in blocks.members[rank])
            continue
        if blocks.padded == 0:
            continue
        buffer = tf.concat([_block(blocks, r, gradients, dtype, blocks.padded)
                            for r in range(world_size)], 0)
        mine = kernels.reducescatter([buffer], op, prescale, postscale, group_name,
                                     process_sets.view(process_set).set_id)[0]
        result.update(_unpack(mine, blocks, rank, 0, shapes))
    return result


def allgather_from_owners(values: Dict[int, tf.Tensor], shapes: Dict[int, tf.TensorShape],
                          dtypes: Dict[int, tf.DType], owners: Sequence[int], rank: int,
                          world_size: int, name: str,
                          process_set: ProcessSet) -> Dict[int, tf.Tensor]:
    """Every rank's variables, from the ranks that own them.

    Args:
        values: This rank's own values, by position.
        shapes: The full shape of every position to gather.
        dtypes: The dtype of every position to gather.
        owners: The plan.
        rank: This rank's position in the process set.
        world_size: The process set's size.
        name: Collective name prefix, the same on every rank.
        process_set: The ranks that share the state.

    Returns:
        The values of the positions other ranks own.
    """
    groups = _by_dtype(sorted(shapes), lambda p: dtypes[p])
    layouts = []
    mine = []
    for dtype, positions in groups.items():
        blocks = plan_blocks(positions, {p: shapes[p].num_elements() for p in positions},
                             owners, world_size)
        layouts.append(blocks)
        if kernels.in_xla():
            total = sum(blocks.lengths)
            before = sum(blocks.lengths[:rank])
            own = _block(blocks, rank, values, dtype)
            mine.append(tf.pad(own, [[before, total - before - blocks.lengths[rank]]]))
        else:
            mine.append(_block(blocks, rank, values, dtype))
    if not mine:
        return {}
    if kernels.in_xla():
        gathered = grouped_allreduce(mine, name=name, op=Sum, process_set=process_set)
    else:
        gathered = grouped_allgather_mixed(mine, name, process_sets.view(process_set).set_id)
    result: Dict[int, tf.Tensor] = {}
    for blocks, flat in zip(layouts, gathered):
        start = 0
        for r in range(world_size):
            if r != rank:
                result.update(_unpack(flat, blocks, r, start, shapes))
            start += blocks.lengths[r]
    return result

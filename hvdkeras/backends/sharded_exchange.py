"""The collectives of a sharded optimizer step under the torch and JAX
backends: gradients to their owners (one reduce-scatter per dtype, ZeRO
stage 2) and updated weights back to every rank (stages 1 and 2).

Both work on one flat buffer per dtype laid out by `plan.plan_blocks`: a
block per rank, holding that rank's variables one after another, padded to
the longest block. Every block then has the same length, which is what an
even reduce-scatter needs and what `jax.jit` needs of the weights'
allgather (the shape each rank receives is fixed when the step compiles).
Under torch the weights instead travel as one fused
broadcast per owner straight into the variables' own memory: the flat
buffers cost a fresh allocation and two copies per step there, about as long
as the exchange itself (measured in docs/backends.md). The tensors are
the backend's own (torch tensors, JAX arrays, traced inside `jit`), built
with `keras.ops`. Under `jit` the step runs its collectives in call order
(Note [collectives in call order] in `hvdkeras/backends/jax/ops.py`).

What may import this module: the rest of `hvdkeras.backends`.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Hashable, Iterator, List, Mapping, Optional, Sequence, Tuple

import keras
import numpy as np

from hvdkeras.backends import dispatch
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet
from hvdkeras.sharding.plan import Blocks, by_dtype, plan_blocks
from hvdkeras.sharding.state import ShardState

def _elements(shape: Sequence[int]) -> int:
    return int(np.prod(tuple(shape), dtype=np.int64))


def _dtype_blocks(values: Dict[Hashable, Any], owners: Mapping[Hashable, int], world_size: int
                  ) -> Iterator[Tuple[int, str, Blocks]]:
    """(number, dtype, layout) of each dtype's flat buffer that holds anything,
    in the same order on every rank."""
    groups = by_dtype(sorted(values),
                      lambda p: keras.backend.standardize_dtype(values[p].dtype))
    for number, (dtype, positions) in enumerate(groups.items()):
        blocks = plan_blocks(positions, {p: _elements(values[p].shape) for p in positions},
                             owners, world_size)
        if blocks.padded:
            yield number, dtype, blocks


def _block_buffer(values: Dict[Hashable, Any], blocks: Blocks, rank: int,
                  dtype: str) -> List[Any]:
    """The flat parts of `rank`'s block, padded to `blocks.padded`."""
    parts = [keras.ops.reshape(values[p], [-1]) for p in blocks.members[rank]]
    if blocks.padded > blocks.lengths[rank]:
        parts.append(keras.ops.zeros([blocks.padded - blocks.lengths[rank]], dtype))
    return parts


def _unpack(flat: Any, blocks: Blocks, rank: int, start: int,
            shapes: Dict[Hashable, Sequence[int]]) -> Dict[Hashable, Any]:
    out = {}
    for p, offset in zip(blocks.members[rank], blocks.offsets[rank]):
        size = _elements(shapes[p])
        out[p] = keras.ops.reshape(flat[start + offset:start + offset + size], shapes[p])
    return out


def reduce_scatter_to_owners(gradients: Dict[Hashable, Any], owners: Mapping[Hashable, int],
                             rank: int,
                             world_size: int, name: str, op: int, prescale: float,
                             postscale: float, process_set: ProcessSet,
                             compression: Optional[Any] = None) -> Dict[Hashable, Any]:
    """Reduces dense gradients across ranks; each rank gets its own only: the
    arguments and result of `hvdkeras.sharding.exchange.reduce_scatter_to_owners`
    on the backend's tensors, plus `compression` (`hvdkeras.Compression.fp16`
    or `.bf16` sends floating gradients at half width; the results come back
    in their own dtypes)."""
    reducescatter = dispatch.backend_function("reducescatter")
    # The compressor's own wire dtype (hvdkeras.collectives.compression).
    wire = getattr(compression, "wire_dtype", None)
    shapes = {p: tuple(g.shape) for p, g in gradients.items()}
    result: Dict[Hashable, Any] = {}
    for number, dtype, blocks in _dtype_blocks(gradients, owners, world_size):
        parts = [part for r in range(world_size)
                 for part in _block_buffer(gradients, blocks, r, dtype)]
        buffer = keras.ops.concatenate(parts, axis=0)
        floating = "float" in dtype
        if wire is not None and floating and dtype != wire:
            buffer = keras.ops.cast(buffer, wire)
        mine = reducescatter(buffer, name=name if number == 0 else f"{name}.{number}", op=op,
                             prescale_factor=prescale, postscale_factor=postscale,
                             process_set=process_set)
        result.update(_unpack(keras.ops.cast(mine, dtype), blocks, rank, 0, shapes))
    return result


def share_from_owners(state: ShardState, name: str) -> None:
    """Gives every rank the current values of the variables other ranks own,
    and of the other ranks' pieces of split ones (Note [split variables]).

    Args:
        state: The shard (its variables: this rank's own ones, and its
            piece variables, hold its updated values).
        name: Collective name prefix, the same on every rank.
    """
    variables = state.variables
    if keras.backend.backend() == "torch":
        # Lazy: the torch binding, present under that backend only.
        torch_ops = importlib.import_module("hvdkeras.backends.torch.ops")
        set_id = process_sets.view(state.process_set).set_id
        for p, part in state.piece_variables.items():
            piece = state.piece_of(p, state.rank)
            variables[p].value.data[piece.begin:piece.end].copy_(part.value.data)
        for owner in range(state.world_size):
            # Row blocks of a contiguous tensor are contiguous views: each
            # piece lands straight in its variable's memory.
            mine = [v.value.data for p, v in enumerate(variables) if state.owners[p] == owner]
            mine += [variables[p].value.data[piece.begin:piece.end]
                     for p in sorted(state.pieces)
                     for piece in state.pieces[p] if piece.rank == owner]
            if mine:
                torch_ops.broadcast_in_place(mine, f"{name}_from{owner}", owner, set_id)
        return
    units, owner_of = state.weight_units(lambda variable: variable.value)
    received = allgather_from_owners(units, owner_of, state.rank, state.world_size, name,
                                     state.process_set)
    for (p, holder), value in received.items():
        if holder < 0:
            variables[p].assign(value)
    for p, pieces in state.pieces.items():
        variables[p].assign(keras.ops.concatenate(
            [units[(p, piece.rank)] if piece.rank == state.rank else received[(p, piece.rank)]
             for piece in pieces], axis=0))


def allgather_from_owners(values: Dict[Hashable, Any], owners: Mapping[Hashable, int],
                          rank: int, world_size: int, name: str,
                          process_set: ProcessSet) -> Dict[Hashable, Any]:
    """The values of the positions other ranks own, from their owners.

    Args:
        values: The current value of every unit to share, by sortable key
            (this rank's own are sent; the others only give the shapes).
        owners: Each unit's owner.
        rank: This rank's position in the process set.
        world_size: The process set's size.
        name: Collective name prefix, the same on every rank.
        process_set: The ranks that share the state.

    Returns:
        The received value of every position another rank owns.
    """
    allgather = dispatch.backend_function("allgather")
    shapes = {p: tuple(v.shape) for p, v in values.items()}
    result: Dict[Hashable, Any] = {}
    for number, dtype, blocks in _dtype_blocks(values, owners, world_size):
        mine = keras.ops.concatenate(_block_buffer(values, blocks, rank, dtype), axis=0)
        everyone = allgather(mine, name=name if number == 0 else f"{name}.{number}",
                             process_set=process_set)
        for owner in range(world_size):
            if owner != rank:
                result.update(_unpack(everyone, blocks, owner, owner * blocks.padded, shapes))
    return result

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
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import keras
import numpy as np

from hvdkeras.backends import dispatch
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet
from hvdkeras.sharding.plan import REPLICATED, Blocks, by_dtype, plan_blocks

def _elements(shape: Sequence[int]) -> int:
    return int(np.prod(tuple(shape), dtype=np.int64))


def _dtype_blocks(values: Dict[int, Any], owners: Sequence[int], world_size: int
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


def _block_buffer(values: Dict[int, Any], blocks: Blocks, rank: int, dtype: str) -> List[Any]:
    """The flat parts of `rank`'s block, padded to `blocks.padded`."""
    parts = [keras.ops.reshape(values[p], [-1]) for p in blocks.members[rank]]
    if blocks.padded > blocks.lengths[rank]:
        parts.append(keras.ops.zeros([blocks.padded - blocks.lengths[rank]], dtype))
    return parts


def _unpack(flat: Any, blocks: Blocks, rank: int, start: int,
            shapes: Dict[int, Sequence[int]]) -> Dict[int, Any]:
    out = {}
    for p, offset in zip(blocks.members[rank], blocks.offsets[rank]):
        size = _elements(shapes[p])
        out[p] = keras.ops.reshape(flat[start + offset:start + offset + size], shapes[p])
    return out


def reduce_scatter_to_owners(gradients: Dict[int, Any], owners: Sequence[int], rank: int,
                             world_size: int, name: str, op: int, prescale: float,
                             postscale: float, process_set: ProcessSet,
                             compression: Optional[Any] = None) -> Dict[int, Any]:
    """Reduces dense gradients across ranks; each rank gets its own only: the
    arguments and result of `hvdkeras.sharding.exchange.reduce_scatter_to_owners`
    on the backend's tensors, plus `compression` (`hvdkeras.Compression.fp16`
    or `.bf16` sends floating gradients at half width; the results come back
    in their own dtypes)."""
    reducescatter = dispatch.backend_function("reducescatter")
    # The compressor's own wire dtype (hvdkeras.collectives.compression).
    wire = getattr(compression, "wire_dtype", None)
    shapes = {p: tuple(g.shape) for p, g in gradients.items()}
    result: Dict[int, Any] = {}
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


def share_from_owners(variables: Sequence[Any], owners: Sequence[int], rank: int,
                      world_size: int, name: str, process_set: ProcessSet) -> None:
    """Gives every rank the current values of the variables other ranks own.

    Args:
        variables: The Keras variables, in plan order (each rank's own ones
            hold its updated values).
        owners: The plan.
        rank: This rank's position in the process set.
        world_size: The process set's size.
        name: Collective name prefix, the same on every rank.
        process_set: The ranks that share the state.
    """
    if keras.backend.backend() == "torch":
        # Lazy: the torch binding, present under that backend only.
        torch_ops = importlib.import_module("hvdkeras.backends.torch.ops")
        set_id = process_sets.view(process_set).set_id
        for owner in range(world_size):
            mine = [v.value.data for p, v in enumerate(variables) if owners[p] == owner]
            if mine:
                torch_ops.broadcast_in_place(mine, f"{name}_from{owner}", owner, set_id)
        return
    values = {p: v.value for p, v in enumerate(variables) if owners[p] != REPLICATED}
    for p, value in allgather_from_owners(values, owners, rank, world_size, name,
                                          process_set).items():
        variables[p].assign(value)


def allgather_from_owners(values: Dict[int, Any], owners: Sequence[int], rank: int,
                          world_size: int, name: str,
                          process_set: ProcessSet) -> Dict[int, Any]:
    """The values of the positions other ranks own, from their owners.

    Args:
        values: The current value of every position to share (this rank's
            own are sent; the others only give the shapes).
        owners: The plan.
        rank: This rank's position in the process set.
        world_size: The process set's size.
        name: Collective name prefix, the same on every rank.
        process_set: The ranks that share the state.

    Returns:
        The received value of every position another rank owns.
    """
    allgather = dispatch.backend_function("allgather")
    shapes = {p: tuple(v.shape) for p, v in values.items()}
    result: Dict[int, Any] = {}
    for number, dtype, blocks in _dtype_blocks(values, owners, world_size):
        mine = keras.ops.concatenate(_block_buffer(values, blocks, rank, dtype), axis=0)
        everyone = allgather(mine, name=name if number == 0 else f"{name}.{number}",
                             process_set=process_set)
        for owner in range(world_size):
            if owner != rank:
                result.update(_unpack(everyone, blocks, owner, owner * blocks.padded, shapes))
    return result

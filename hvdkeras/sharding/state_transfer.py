"""Moving sharded optimizer state to and from one rank: for writing a normal
checkpoint (every owner sends its slots to the root, which writes the file
in the unsharded layout) and for resuming (the root reads the file and
sends each owner its slots). Collective: every rank calls these, eagerly.

Only the root holds the whole state, and only while the file is written or
read; the other ranks send or receive their own slots alone (one alltoall
per dtype, with nothing travelling between non-root ranks). Slot i of the
file is slot i of the optimizer on every rank (Note [stand-ins keep the
layout]).

What may import this module: `hvdkeras.sharding`, the callbacks and
`hvdkeras.training`.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, Iterator, List

import keras
import numpy as np

from hvdkeras.engine.process_sets import ProcessSet
from hvdkeras.host import arrays
from hvdkeras.host.objects import allgather_object, broadcast_object
from hvdkeras.sharding.sharded_optimizer import shard_holder
from hvdkeras.sharding.state import ShardState

ROOT = 0


def _dtype_groups(holder: Any, state: ShardState) -> Dict[str, List[int]]:
    """Indices of the sharded slots, by dtype name (sorted: the same on every rank)."""
    groups: Dict[str, List[int]] = {}
    for i, variable in enumerate(holder.variables):
        if not state.is_everywhere(i):
            groups.setdefault(keras.backend.standardize_dtype(variable.dtype), []).append(i)
    return dict(sorted(groups.items()))


def _alltoall(flat: np.ndarray, splits: List[int], name: str,
              process_set: ProcessSet) -> np.ndarray:
    return arrays.alltoall(flat, splits, name, process_set)[0]


def _owned_by(state: ShardState, indices: List[int], rank: int) -> List[int]:
    """The slots among `indices` whose values `rank` holds: those of variables
    it owns, and its pieces of split ones (Note [split variables])."""
    return [i for i in indices if state.owners[state.layout[i]] == rank
            or (state.is_piece_slot(i) and state.piece_of(state.layout[i], rank) is not None)]


def _rows(state: ShardState, index: int, rank: int, value: np.ndarray) -> np.ndarray:
    """`rank`'s rows of a whole slot value (all of it unless the slot is split)."""
    if not state.is_piece_slot(index):
        return value
    piece = state.piece_of(state.layout[index], rank)
    return value[piece.begin:piece.end]


def gather_to_root(optimizer: Any) -> None:
    """Puts every slot's value on the root (into `ShardState.gathered`)."""
    holder = shard_holder(optimizer)
    state = holder._hvdkeras_shards
    held = set(_owned_by(state, list(range(len(holder.variables))), state.rank))
    shapes = allgather_object({i: tuple(v.shape) for i, v in enumerate(holder.variables)
                               if i in held},
                              name=f"{state.name}_gather.shapes", process_set=state.process_set)
    gathered: Dict[int, np.ndarray] = {}
    for dtype, indices in _dtype_groups(holder, state).items():
        mine = [] if state.rank == ROOT else _owned_by(state, indices, state.rank)
        flat = (np.concatenate([holder.variables[i].numpy().reshape(-1) for i in mine])
                if mine else np.zeros([0], dtype))
        splits = [flat.size if r == ROOT else 0 for r in range(state.world_size)]
        received = _alltoall(flat, splits, f"{state.name}_gather.{dtype}", state.process_set)
        if state.rank != ROOT:
            continue
        pieces: Dict[int, Dict[int, np.ndarray]] = {}
        offset = 0
        for sender in range(state.world_size):
            if sender == ROOT:
                continue
            for i in _owned_by(state, indices, sender):
                size = int(np.prod(shapes[sender][i], dtype=np.int64))
                value = received[offset:offset + size].reshape(shapes[sender][i])
                offset += size
                if state.is_piece_slot(i):
                    pieces.setdefault(i, {})[sender] = value
                else:
                    gathered[i] = value
        for i in indices:  # a split slot: its pieces in row order, which is rank order
            if state.is_piece_slot(i):
                if i in held:
                    pieces.setdefault(i, {})[ROOT] = holder.variables[i].numpy()
                gathered[i] = np.concatenate([pieces[i][r] for r in sorted(pieces[i])])
    state.gathered = gathered if state.rank == ROOT else None


def scatter_from_root(optimizer: Any) -> None:
    """Sends each owner the slot values the root read (`ShardState.pending`)."""
    holder = shard_holder(optimizer)
    state = holder._hvdkeras_shards
    pending = state.pending or {}
    present = broadcast_object(sorted(pending) if state.rank == ROOT else None,
                               root_rank=ROOT, name=f"{state.name}_scatter.present",
                               process_set=state.process_set)
    present = set(present)
    for dtype, indices in _dtype_groups(holder, state).items():
        indices = [i for i in indices if i in present]
        if state.rank == ROOT:
            parts, splits = [], []
            for r in range(state.world_size):
                values = ([] if r == ROOT else
                          [_rows(state, i, r, pending[i]).astype(dtype, copy=False).reshape(-1)
                           for i in _owned_by(state, indices, r)])
                splits.append(int(sum(v.size for v in values)))
                parts.extend(values)
            flat = np.concatenate(parts) if parts else np.zeros([0], dtype)
        else:
            flat, splits = np.zeros([0], dtype), [0] * state.world_size
        received = _alltoall(flat, splits, f"{state.name}_scatter.{dtype}", state.process_set)
        if state.rank == ROOT:
            continue
        offset = 0
        for i in _owned_by(state, indices, state.rank):
            variable = holder.variables[i]
            size = int(np.prod(variable.shape, dtype=np.int64))
            variable.assign(received[offset:offset + size].reshape(variable.shape))
            offset += size
    state.pending = None
    state.collecting = False


def _parameters(model_or_optimizer: Any) -> Any:
    """The weights sharded at `zero_stage=3` behind a model or optimizer, or None."""
    optimizer = getattr(model_or_optimizer, "optimizer", model_or_optimizer)
    holder = shard_holder(optimizer)
    if holder is None or not holder.built:
        return None
    return getattr(holder, "_hvdkeras_parameters", None)


def whole_weights(model_or_optimizer: Any) -> ContextManager[None]:
    """A block in which every rank holds the model's weights whole (at
    `zero_stage=3`; elsewhere a block that does nothing). Collective."""
    parameters = _parameters(model_or_optimizer)
    return contextlib.nullcontext() if parameters is None else parameters.gathered_weights()


def share_weights_from(model_or_optimizer: Any, root: int) -> None:
    """Inside `whole_weights`: every rank keeps its rows of `root`'s whole
    weights (after a load on `root` alone). Does nothing below stage 3,
    where `broadcast_model` moves the weights. Collective."""
    parameters = _parameters(model_or_optimizer)
    if parameters is not None:
        parameters.share_whole_from(root)


@contextlib.contextmanager
def gathered_optimizer_state(model_or_optimizer: Any) -> Iterator[None]:
    """Lets rank 0 save a sharded optimizer's whole state inside the block.

    Every rank must enter it (it is collective). Inside, rank 0 holds the
    values of every slot (and at `zero_stage=3` every rank the whole weights), so `model.save(...)` / `model.save_weights(...)` on
    rank 0 writes a normal checkpoint that loads without hvdkeras and into
    an unsharded optimizer. Outside, rank 0 holds its own shard only again.
    For an optimizer that is not sharded it does nothing.

    Args:
        model_or_optimizer: A compiled Keras model, or its optimizer.

    Example:

    ```python
    with hvd.gathered_optimizer_state(model):
        if hvd.rank() == 0:
            model.save("final.keras")
    ```
    """
    optimizer = getattr(model_or_optimizer, "optimizer", model_or_optimizer)
    holder = shard_holder(optimizer)
    if holder is None or not holder.built or holder._hvdkeras_shards.world_size == 1:
        yield
        return
    # At stage 3 the weights are sharded too: every rank holds them whole
    # for the block (Note [sharded parameters]).
    with whole_weights(holder):
        gather_to_root(holder)
        try:
            yield
        finally:
            holder._hvdkeras_shards.gathered = None

"""Stage 3's group gathers under torch: started (at a read, or ahead of it),
then finished. Which gather to start ahead: Note [gathers started ahead] in
`hvdkeras/sharding/gathers_ahead.py`.

What may import this module: `hvdkeras.backends.torch.parameters`.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from hvdkeras.backends.torch import ops as torch_ops
from hvdkeras.engine.requests import Pending
from hvdkeras.host import buffers
from hvdkeras.sharding.plan import by_dtype

# A started gather: per dtype, its request, its members (indices into the
# group) and its input (a copy of this rank's rows, alive until the wait).
Started = List[Tuple[Pending, List[int], torch.Tensor]]


def start_gather(held: Sequence[torch.Tensor], name: str, set_id: int) -> Started:
    """Starts the allgathers of a group whose rows this rank holds in
    `held` (one per dtype, named `name` and the dtype's number)."""
    started: Started = []
    groups = by_dtype(list(range(len(held))), lambda k: str(held[k].dtype))
    for number, members in enumerate(groups.values()):
        with torch.no_grad():
            mine = torch.cat([held[k].detach().reshape(-1) for k in members])
        pending = buffers.submit_allgather([torch_ops.describe(mine, "allgather")],
                                           f"{name}_{number}", set_id, keep=mine)
        started.append((pending, members, mine))
    return started


def finish_gather(started: Started, shapes: Sequence[Tuple[int, ...]],
                  held_elements: Callable[[int, int], int],
                  world_size: int) -> List[torch.Tensor]:
    """Waits for a started group's gathers; returns each member's whole
    value (shape `shapes[k]`). `held_elements(k, rank)`: how many of member
    `k`'s elements `rank` holds."""
    out: List[Optional[torch.Tensor]] = [None] * len(shapes)
    for pending, members, mine in started:
        with pending.wait() as done:
            everyone = mine.new_empty(done.shape(0))
            done.copy_output(0, everyone.data_ptr())
        cut_whole(everyone, members, shapes, held_elements, world_size, out)
    return out  # type: ignore[return-value]


def cut_whole(everyone: torch.Tensor, members: Sequence[int],
              shapes: Sequence[Tuple[int, ...]], held_elements: Callable[[int, int], int],
              world_size: int, out: List[Optional[torch.Tensor]]) -> None:
    """Cuts one dtype's gathered buffer (every rank's rows of `members`, in
    rank order) into each member's whole value, written to `out[k]`."""
    start = 0
    parts: Dict[int, List[torch.Tensor]] = {k: [] for k in members}
    for rank in range(world_size):
        for k in members:
            size = held_elements(k, rank)
            parts[k].append(everyone[start:start + size])
            start += size
    for k in members:
        flat = parts[k][0] if len(parts[k]) == 1 else torch.cat(parts[k])
        out[k] = flat.reshape(shapes[k])


def drop(started: Started) -> None:
    """Waits for a started gather that no read will use, and forgets it."""
    for pending, _, _ in started:
        with pending.wait():
            pass

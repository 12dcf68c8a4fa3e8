"""Which rank keeps which parameter's optimizer state: pure planning for
sharded (ZeRO-style) optimizers, tested without MPI.

Note [whole-variable shards]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~
hvdkeras shards optimizer state by whole variables: each trainable variable
has one owner rank, which keeps every slot of that variable (Adam's moments,
Adafactor's factored rows and columns, Muon's momentum, EMA averages, Keras's
gradient accumulators) and runs the optimizer's update for it. Nothing an
optimizer does per variable (LAMB's trust ratio, Adafactor's factoring,
Muon's orthogonalised step, weight decay, `clipnorm`) changes, so every
built-in optimizer gives stage 0's result without special cases; the only
step that spans variables, `global_clipnorm`, sums the owners' partial norms
(sharding/sharded_optimizer.py). The price is balance: the largest shard can
exceed the ideal 1/N by up to one variable. The planner below assigns the
largest variables first to the least-loaded rank (LPT), which keeps the
largest shard within `total/N + largest variable` bytes.

The plan is a function of the variables' sizes, the number of ranks and the
replicated set alone, so every rank computes the same plan without talking.

What may import this module: anything in hvdkeras (it imports nothing of it).
"""

from __future__ import annotations

import heapq
from typing import (AbstractSet, Any, Callable, Dict, Hashable, List, Mapping, NamedTuple,
                    Sequence)

REPLICATED = -1
"""The owner of a variable that every rank updates itself (a local variable)."""

SPLIT = -4
"""The owner of a variable cut into row blocks held by several ranks
(Note [split variables] in `split_plan`)."""


def plan_owners(sizes: Sequence[int], world_size: int,
                replicated: AbstractSet[int] = frozenset()) -> List[int]:
    """Assigns each variable an owner rank, balancing bytes.

    Args:
        sizes: Bytes of each variable (its element count times its item size),
            in the order the optimizer was built with.
        world_size: Number of ranks sharing the state (>= 1).
        replicated: Positions every rank keeps and updates itself (variables
            whose gradients are not reduced); they get `REPLICATED`.

    Returns:
        One owner per variable: a rank in `[0, world_size)`, or `REPLICATED`.
        Largest variables are placed first, each on the rank with the fewest
        bytes so far (the lower rank on ties), so the result is deterministic.

    Example: `plan_owners([8, 4, 4, 2], 2) == [0, 1, 1, 0]`.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}.")
    bad = [s for s in sizes if s < 0]
    if bad:
        raise ValueError(f"variable sizes must be >= 0, got {bad[:3]}.")
    owners = [REPLICATED] * len(sizes)
    loads = [(0, rank) for rank in range(world_size)]  # (bytes so far, rank): a heap
    order = sorted((i for i in range(len(sizes)) if i not in replicated),
                   key=lambda i: (-sizes[i], i))
    for i in order:
        load, rank = heapq.heappop(loads)
        owners[i] = rank
        heapq.heappush(loads, (load + sizes[i], rank))
    return owners


def shard_bytes(sizes: Sequence[int], owners: Sequence[int], world_size: int) -> List[int]:
    """Bytes each rank owns (replicated variables counted on no rank)."""
    totals = [0] * world_size
    for size, owner in zip(sizes, owners):
        if owner != REPLICATED:
            totals[owner] += size
    return totals


class Blocks(NamedTuple):
    """How one flat buffer is laid out: a block per rank, in rank order.

    Attributes:
        members: Per rank, the variable positions in its block, ascending.
        offsets: Per rank, each member's start within the rank's block.
        lengths: Per rank, the elements its members take together.
        padded: The block length when every block is padded to the longest
            (what an even reduce-scatter needs).
    """

    members: List[List[Hashable]]
    offsets: List[List[int]]
    lengths: List[int]
    padded: int


def plan_blocks(positions: Sequence[Hashable], elements: Mapping[Hashable, int],
                owners: Mapping[Hashable, int], world_size: int) -> Blocks:
    """Lays out `positions` (variables of one dtype) as per-rank blocks.

    Args:
        positions: Variable positions (or other sortable unit keys) to lay
            out (replicated ones are skipped).
        elements: Element count of each position.
        owners: The owner of each position (`plan_owners`'s list will do).
        world_size: Number of ranks.

    Returns:
        A `Blocks`: rank r's block holds its variables in ascending position
        order, one after another.

    Example: with owners `[0, 1, 0]` and 2 elements each, positions `[0, 1, 2]`
    give members `[[0, 2], [1]]`, offsets `[[0, 2], [0]]`, lengths `[4, 2]`,
    padded `4`.
    """
    members: List[List[Hashable]] = [[] for _ in range(world_size)]
    for p in sorted(positions):
        if owners[p] != REPLICATED:
            members[owners[p]].append(p)
    offsets, lengths = [], []
    for block in members:
        starts, total = [], 0
        for p in block:
            starts.append(total)
            total += elements[p]
        offsets.append(starts)
        lengths.append(total)
    return Blocks(members, offsets, lengths, max(lengths) if lengths else 0)


def by_dtype(positions: Sequence[int], dtype_of: Callable[[int], Any]) -> Dict[Any, List[int]]:
    """`positions` grouped by `dtype_of(position)`, groups in order of first
    appearance (so the same on every rank for the same positions).

    Example: `by_dtype([0, 1, 2], ["f4", "f2", "f4"].__getitem__) == {"f4": [0, 2], "f2": [1]}`.
    """
    groups: Dict[Any, List[int]] = {}
    for p in positions:
        groups.setdefault(dtype_of(p), []).append(p)
    return groups


GATHER_GROUP_BYTES = 32 << 20
"""About how many bytes of whole weights ZeRO stage 3 gathers at once (Note
[sharded parameters] in `tf_parameters`): each group's gradients are
reduce-scattered as soon as the backward pass has made them."""


def plan_gather_groups(positions: Sequence[int], sizes: Mapping[int, int],
                       limit: int = GATHER_GROUP_BYTES) -> List[List[int]]:
    """Consecutive runs of `positions` of about `limit` bytes each.

    A run closes once it holds `limit` bytes or before a variable that would
    take it past `limit`, so a variable larger than `limit` is a group of
    its own.

    Example: `plan_gather_groups([0, 1, 2, 3], {0: 5, 1: 5, 2: 20, 3: 5}, 10)
    == [[0, 1], [2], [3]]`.
    """
    groups: List[List[int]] = []
    current: List[int] = []
    total = 0
    for p in positions:
        if current and total + sizes[p] > limit:
            groups.append(current)
            current, total = [], 0
        current.append(p)
        total += sizes[p]
        if total >= limit:
            groups.append(current)
            current, total = [], 0
    if current:
        groups.append(current)
    return groups

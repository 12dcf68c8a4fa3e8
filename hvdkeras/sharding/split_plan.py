"""Cutting the largest variables into row blocks when whole variables cannot
balance the ranks' optimizer state: pure planning, tested without MPI.

Note [split variables]
~~~~~~~~~~~~~~~~~~~~~~
Whole-variable shards (Note [whole-variable shards] in `plan`) leave one rank
holding most of the state when one variable dominates: an embedding table,
an LM head, the 512x384 kernel of a 96-512-384-10 MLP. Then, and only for
optimizers whose update is elementwise (each element's new value and slots
depend on that element alone: SGD, Adam, AdamW, RMSprop, Lion, ...), the
planner lays the variables end to end in position order, as DeepSpeed lays
out its flat partition, and cuts the line into one stretch of about total/N
bytes per rank, each cut moved to the nearest row boundary inside a
variable that may be cut, or to the nearest variable boundary inside one
that may not. A variable crossing a cut is held in pieces: rank r keeps
rows [begin, end) of it and that block's slots, and updates them as if the
block were a variable of its own, so the result is the one the whole
variable gets. At most N - 1 variables are cut. Optimizers that need a
whole variable (LAMB's trust ratio, Adafactor's factored moments, Muon's
orthogonalised step, `clipnorm`) keep whole variables, as do local
(replicated) variables and scalars. The plan is a function of the sizes,
the rows, N and the two sets, so every rank makes the same one without
talking. The whole-variable plan is kept whenever it is already within
2% (or 64 KiB) of total/N, or no worse than the cut one.

What may import this module: anything in hvdkeras (it imports only `plan`).
"""

from __future__ import annotations

from typing import AbstractSet, Dict, List, NamedTuple, Sequence, Tuple

from hvdkeras.sharding.plan import (GATHER_GROUP_BYTES, REPLICATED, SPLIT, plan_gather_groups,
                                   plan_owners, shard_bytes)

TOLERANCE = 0.02
"""How far above total/N the fullest rank may be before variables are cut."""

MIN_EXCESS_BYTES = 64 << 10
"""Nor are variables cut to save less than this on the fullest rank: pieces
of small models cost more small collectives than they save memory."""


class Piece(NamedTuple):
    """Rows [begin, end) of a split variable, held by `rank`."""

    rank: int
    begin: int
    end: int


def piece_loads(sizes: Sequence[int], rows: Sequence[int], owners: Sequence[int],
                pieces: Dict[int, List[Piece]], world_size: int) -> List[int]:
    """Bytes each rank holds under a plan (replicated variables on no rank)."""
    loads = shard_bytes(sizes, [o if o != SPLIT else REPLICATED for o in owners], world_size)
    for p, parts in pieces.items():
        row_bytes = sizes[p] // max(rows[p], 1)
        for piece in parts:
            loads[piece.rank] += (piece.end - piece.begin) * row_bytes
    return loads


def _cuts(sizes: Sequence[int], rows: Sequence[int], order: Sequence[int],
          cuttable: AbstractSet[int], world_size: int) -> List[int]:
    """Byte offsets of the N + 1 stretch ends along the line of `order`."""
    starts, at = {}, 0
    for p in order:
        starts[p] = at
        at += sizes[p]
    total = at
    cuts = [0]
    for k in range(1, world_size):
        target = total * k / world_size
        cut = total
        for p in order:
            begin, end = starts[p], starts[p] + sizes[p]
            if not begin <= target < end:
                continue
            if p in cuttable and rows[p] >= 2:
                row_bytes = sizes[p] // rows[p]
                cut = begin + round((target - begin) / row_bytes) * row_bytes
            else:
                cut = begin if target - begin <= end - target else end
            break
        cuts.append(max(cut, cuts[-1]))
    cuts.append(total)
    return cuts


def plan_split(sizes: Sequence[int], rows: Sequence[int], world_size: int,
               replicated: AbstractSet[int] = frozenset(),
               cuttable: AbstractSet[int] = frozenset(),
               tolerance: float = TOLERANCE, min_excess_bytes: int = MIN_EXCESS_BYTES
               ) -> Tuple[List[int], Dict[int, List[Piece]]]:
    """Owners for every variable, cutting some into row blocks when that
    balances the ranks better (Note [split variables]).

    Args:
        sizes: Bytes of each variable, in the optimizer's order.
        rows: Rows of each variable (its first dimension; 1 for a scalar).
        world_size: Number of ranks (>= 1).
        replicated: Positions every rank keeps itself (never cut).
        cuttable: Positions that may be cut (the optimizer's update is
            elementwise for them).
        tolerance: Keep whole variables when the fullest rank is within
            this fraction above total/N,
        min_excess_bytes: or within this many bytes.

    Returns:
        `(owners, pieces)`: an owner per variable (a rank, `REPLICATED`, or
        `SPLIT`), and for each `SPLIT` position its pieces in row order.

    Example: `plan_split([400, 40], [10, 10], 2, cuttable={0}, min_excess_bytes=0)` cuts the
    first variable: owners `[SPLIT, 1]`, pieces `{0: [Piece(0, 0, 6),
    Piece(1, 6, 10)]}` (240 bytes on rank 0, 200 on rank 1).
    """
    whole = plan_owners(sizes, world_size, replicated)
    if world_size == 1 or not (set(cuttable) - set(replicated)):
        return whole, {}
    order = [p for p in range(len(sizes)) if p not in replicated]
    total = sum(sizes[p] for p in order)
    excess = max(shard_bytes(sizes, whole, world_size)) - total / world_size
    if total == 0 or excess <= max(total / world_size * tolerance, min_excess_bytes):
        return whole, {}
    cuts = _cuts(sizes, rows, order, set(cuttable) - set(replicated), world_size)
    owners = [REPLICATED] * len(sizes)
    pieces: Dict[int, List[Piece]] = {}
    at = 0
    for p in order:
        begin, end = at, at + sizes[p]
        at = end
        held = [(r, max(begin, cuts[r]), min(end, cuts[r + 1])) for r in range(world_size)
                if max(begin, cuts[r]) < min(end, cuts[r + 1])]
        if not held:  # empty: the rank whose stretch it starts
            owners[p] = next((r for r in range(world_size) if cuts[r] <= begin < cuts[r + 1]),
                             world_size - 1)
        elif len(held) == 1:
            owners[p] = held[0][0]
        else:
            row_bytes = sizes[p] // rows[p]
            owners[p] = SPLIT
            pieces[p] = [Piece(r, (a - begin) // row_bytes, (b - begin) // row_bytes)
                         for r, a, b in held]
    split_load = max(piece_loads(sizes, rows, owners, pieces, world_size))
    if split_load >= max(shard_bytes(sizes, whole, world_size)):
        return whole, {}
    return owners, pieces


def plan_in_groups(sizes: Sequence[int], rows: Sequence[int], world_size: int,
                   replicated: AbstractSet[int] = frozenset(),
                   cuttable: AbstractSet[int] = frozenset(),
                   group_bytes: int = GATHER_GROUP_BYTES
                   ) -> Tuple[List[int], Dict[int, List[Piece]], List[List[int]]]:
    """`plan_split` within each gather group of ZeRO stage 3 (Note [sharded
    parameters] in `tf_parameters`): consecutive variables of about
    `group_bytes`, each group shared out as evenly as its own plan allows,
    so that every group's gather and reduce-scatter moves about 1/N of it
    per rank (and the ranks' totals balance as each group's do).

    Returns:
        `(owners, pieces, groups)`: as `plan_split`'s, plus the groups
        (lists of positions; replicated positions are in none).

    Example: `plan_in_groups([400, 40], [10, 10], 2, cuttable={0, 1}, group_bytes=300)`
    makes groups `[[0], [1]]` and cuts both variables in halves.
    """
    owners = [REPLICATED] * len(sizes)
    pieces: Dict[int, List[Piece]] = {}
    order = [p for p in range(len(sizes)) if p not in replicated]
    groups = plan_gather_groups(order, {p: sizes[p] for p in order}, group_bytes)
    for group in groups:
        group_owners, group_pieces = plan_split(
            [sizes[p] for p in group], [rows[p] for p in group], world_size,
            cuttable={k for k, p in enumerate(group) if p in cuttable}, min_excess_bytes=0)
        for k, p in enumerate(group):
            owners[p] = group_owners[k]
            if k in group_pieces:
                pieces[p] = group_pieces[k]
    return owners, pieces, groups

"""Which rows (or batches) each rank takes: pure, tested without MPI
(Note [shard before shuffling] in hvdkeras/inputs/__init__.py).

What may import this module: the rest of `hvdkeras.inputs`.
"""

from __future__ import annotations

from typing import List


def check_rank(rank: int, size: int) -> None:
    """A clear error for a rank outside [0, size) or a size below 1."""
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size!r}.")
    if not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"rank must be an integer in [0, {size}), got {rank!r}.")


def shard_length(count: int, size: int, rank: int, equal: bool = True) -> int:
    """How many of `count` items rank `rank` of `size` takes by striding
    (items rank, rank + size, ...): `count // size` each with `equal`,
    otherwise one more for the first `count % size` ranks.

    Example: `shard_length(10, 3, 0) == 3`, `shard_length(10, 3, 0, equal=False) == 4`.
    """
    check_rank(rank, size)
    if equal:
        return count // size
    return count // size + (1 if rank < count % size else 0)


def rank_items(count: int, size: int, rank: int, equal: bool = True) -> List[int]:
    """The positions (of `count` items) rank `rank` takes: rank, rank + size,
    ..., `shard_length` of them.

    Example: `rank_items(7, 2, 1) == [1, 3, 5]`.
    """
    return list(range(rank, rank + size * shard_length(count, size, rank, equal), size))


def dropped(count: int, size: int) -> int:
    """How many items no rank takes when the shards are cut to equal length."""
    return count % size

"""Each rank's share of NumPy arrays and of a `keras.utils.PyDataset` (Note
[shard before shuffling] in hvdkeras/inputs/__init__.py).

What may import this module: the facade.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import keras

from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.inputs import plan


def _rank_and_size(process_set: ProcessSet, rank: Optional[int],
                   size: Optional[int]) -> Tuple[int, int]:
    if rank is None or size is None:
        view = process_sets.view(process_set)
        rank = view.set_rank if rank is None else rank
        size = view.size if size is None else size
    plan.check_rank(rank, size)
    return rank, size


def shard_arrays(*arrays: Any, equal_shards: bool = True,
                 process_set: ProcessSet = global_process_set, rank: Optional[int] = None,
                 size: Optional[int] = None) -> Union[Any, Tuple[Any, ...]]:
    """This rank's rows of each array: rows rank, rank + N, ... of all of them.

    The shards are disjoint and together hold every row once (with
    `equal_shards`, the last `len % N` rows are left out so every rank has
    the same number of rows, hence of steps). Shuffle afterwards, per rank
    (`fit(shuffle=True)` shuffles within the shard): the split does not
    depend on any rank's random state.

    Args:
        *arrays: Arrays (NumPy or anything with `len` and slicing) with the
            same number of rows, the same on every rank.
        equal_shards: Cut every shard to `len // N` rows.
        process_set: Shard over this set's ranks (default: all).
        rank: This rank's number in the set (default: from hvdkeras).
        size: The number of shards (default: the set's size).

    Returns:
        This rank's rows: one array for one argument, else a tuple.

    Example:

    ```python
    x_mine, y_mine = hvd.shard_arrays(x_train, y_train)
    model.fit(x_mine, y_mine, batch_size=64, shuffle=True)
    ```
    """
    if not arrays:
        raise ValueError("shard_arrays needs at least one array.")
    lengths = {len(a) for a in arrays}
    if len(lengths) != 1:
        raise ValueError(f"shard_arrays needs arrays with the same number of rows, got "
                         f"{[len(a) for a in arrays]}.")
    rank, size = _rank_and_size(process_set, rank, size)
    count = plan.shard_length(lengths.pop(), size, rank, equal_shards)
    picked = tuple(a[rank:rank + size * count:size] if count else a[:0] for a in arrays)
    return picked[0] if len(picked) == 1 else picked


class ShardedPyDataset(keras.utils.PyDataset):
    """A `keras.utils.PyDataset` whose batches are dealt out to the ranks.

    Rank r takes batches r, r + N, ... of `dataset` (each a whole batch of
    the dataset's size), so every batch is used once per epoch across the
    ranks; every rank gets `len(dataset) // N` of them (the last
    `len % N` are left out, so the ranks run the same number of steps).
    `on_epoch_begin` and `on_epoch_end` go to `dataset`, on every rank, so a
    dataset that reshuffles there must do it the same way on all ranks (a
    seed of its own, not the rank's).

    Args:
        dataset: The `PyDataset` (the same batches on every rank).
        process_set: Shard over this set's ranks (default: all).
        rank: This rank's number in the set (default: from hvdkeras).
        size: The number of shards (default: the set's size).
        **kwargs: `PyDataset`'s own (`workers`, `use_multiprocessing`,
            `max_queue_size`).

    Example:

    ```python
    model.fit(hvd.ShardedPyDataset(MyBatches(x, y, batch_size=32)), epochs=3)
    ```
    """

    def __init__(self, dataset: keras.utils.PyDataset,
                 process_set: ProcessSet = global_process_set, rank: Optional[int] = None,
                 size: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dataset = dataset
        self.shard_rank, self.shard_size = _rank_and_size(process_set, rank, size)

    def __len__(self) -> int:
        return plan.shard_length(len(self.dataset), self.shard_size, self.shard_rank)

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of a shard of {len(self)} batches")
        return self.dataset[self.shard_rank + index * self.shard_size]

    def on_epoch_begin(self) -> None:
        getattr(self.dataset, "on_epoch_begin", lambda: None)()

    def on_epoch_end(self) -> None:
        getattr(self.dataset, "on_epoch_end", lambda: None)()


"""Each rank's share of a torch dataset: `torch.utils.data.DistributedSampler`
with hvdkeras's ranks (Note [shard before shuffling] in
hvdkeras/inputs/__init__.py).

What may import this module: the facade (it imports torch).
"""

from __future__ import annotations

from typing import Any, Optional

import torch.utils.data

from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.inputs import epochs


class DistributedSampler(torch.utils.data.DistributedSampler):
    """`torch.utils.data.DistributedSampler` over hvdkeras's ranks.

    Every epoch all ranks draw the same permutation of the dataset's indices
    (from `seed` and the epoch, not from any rank's random state) and rank r
    takes positions r, r + N, ... of it: each index is seen once per epoch
    across the ranks (with `drop_last=False`, padded by repeating the first
    indices to a multiple of N, as torch's sampler does). It follows `fit`'s
    epochs through `hvdkeras.callbacks.DataEpochCallback` (part of
    `standard_callbacks`); in a loop of your own, call `set_epoch(epoch)` at
    each epoch's start.

    Args:
        dataset: A map-style torch dataset (`__len__` and `__getitem__`).
        shuffle: A new permutation each epoch (False: the dataset's order).
        seed: The permutations' seed, the same on every rank.
        drop_last: Leave out the last `len % N` indices instead of padding.
        process_set: Shard over this set's ranks (default: all).

    Example:

    ```python
    sampler = hvd.DistributedSampler(dataset, shuffle=True, seed=42)
    loader = torch.utils.data.DataLoader(dataset, batch_size=32, sampler=sampler)
    model.fit(loader, epochs=5, callbacks=hvd.callbacks.standard_callbacks())
    ```
    """

    def __init__(self, dataset: Any, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, process_set: ProcessSet = global_process_set,
                 num_replicas: Optional[int] = None, rank: Optional[int] = None) -> None:
        view = process_sets.view(process_set)
        super().__init__(dataset, num_replicas=view.size if num_replicas is None else num_replicas,
                         rank=view.set_rank if rank is None else rank, shuffle=shuffle,
                         seed=seed, drop_last=drop_last)
        epochs.follow_epochs(self)

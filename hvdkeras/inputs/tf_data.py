"""Each rank's share of a `tf.data` pipeline (Note [shard before shuffling]
in hvdkeras/inputs/__init__.py).

What may import this module: the facade and the recipes (it imports
TensorFlow).
"""

from __future__ import annotations

from typing import Any, Optional

import tensorflow as tf

from hvdkeras import compat
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set

_SHUFFLES = ("ShuffleDataset", "ShuffleDatasetV2", "ShuffleDatasetV3",
             "ShuffleAndRepeatDataset", "ShuffleAndRepeatDatasetV2")


def shuffles(dataset: tf.data.Dataset) -> bool:
    """Whether the pipeline shuffles somewhere (False where TensorFlow cannot say)."""
    ops = compat.dataset_op_types(dataset)
    return bool(ops and ops.intersection(_SHUFFLES))


def shard_dataset(dataset: tf.data.Dataset, shuffle_buffer: Optional[int] = None,
                  seed: Optional[int] = None, equal_shards: bool = True, cache: bool = False,
                  allow_shuffled: bool = False,
                  process_set: ProcessSet = global_process_set,
                  rank: Optional[int] = None, size: Optional[int] = None) -> tf.data.Dataset:
    """This rank's elements of `dataset`, then shuffled within the shard.

    Every rank takes elements rank, rank + N, ... of the unshuffled
    pipeline, so the shards are disjoint and together hold every element
    once, whatever each rank's random seed; then each shard is shuffled with
    `seed`, anew each epoch. Shuffling before sharding would let per-rank
    seeds make the shards overlap silently, so a pipeline that already
    shuffles is refused. Batch after this call.

    Args:
        dataset: An unbatched, unshuffled `tf.data.Dataset` (the same
            elements in the same order on every rank).
        shuffle_buffer: Shuffle each shard with this buffer (None: no
            shuffle). A buffer at least the shard's length shuffles fully.
        seed: The shuffle's seed (TensorFlow's global seed takes part too;
            the shards stay disjoint whatever it is).
        equal_shards: Cut the shards to the same length when the
            cardinality is known (at most N - 1 elements of an epoch are
            left out, the same ones every epoch), so every rank runs the same
            number of steps. False keeps all of them, shards differing by one.
        cache: Cache the shard before shuffling it (one read of the source).
        allow_shuffled: Take a pipeline that shuffles already (its order
            must then be the same on every rank: a fixed seed and the same
            global seed everywhere).
        process_set: Shard over this set's ranks (default: all).
        rank: This rank's number in the set (default: from hvdkeras).
        size: The number of shards (default: the set's size).

    Returns:
        The shard, shuffled if asked.

    Raises:
        ValueError: the pipeline shuffles already, or rank/size are out of range.

    Example:

    ```python
    ds = tf.data.Dataset.from_tensor_slices((x, y))
    ds = hvd.shard_dataset(ds, shuffle_buffer=10_000, seed=42).batch(64)
    model.fit(ds, epochs=5)
    ```
    """
    if rank is None or size is None:
        view = process_sets.view(process_set)
        rank = view.set_rank if rank is None else rank
        size = view.size if size is None else size
    if not allow_shuffled and shuffles(dataset):
        raise ValueError(
            "hvdkeras.shard_dataset got a pipeline that shuffles already. Shuffling before "
            "sharding lets each rank shard its own order: with per-rank random seeds the "
            "shards overlap and some rows are never seen, with no error. Remove the "
            ".shuffle(...) and pass shuffle_buffer= (and seed=) here, which shards first; "
            "or pass allow_shuffled=True if the order is the same on every rank.")
    if equal_shards and size > 1:
        count = int(dataset.cardinality())
        if count >= 0:
            dataset = dataset.take(count // size * size)
    if size > 1:
        dataset = dataset.shard(size, rank)
    if cache:
        dataset = dataset.cache()
    if shuffle_buffer:
        dataset = dataset.shuffle(int(shuffle_buffer), seed=seed, reshuffle_each_iteration=True)
    return dataset

"""The data-sharding rules without MPI (Note [shard before shuffling]): the
pure plan, and each helper given its rank and size, one simulated rank at a
time, each with its own random seed."""

import numpy as np
import pytest

from hvdkeras.inputs import plan


@pytest.mark.parametrize("count, size", [(10, 3), (12, 3), (7, 2), (2, 4), (0, 2)])
@pytest.mark.parametrize("equal", [True, False])
def test_rank_items_are_disjoint_and_cover_all_but_the_remainder(count, size, equal):
    shards = [plan.rank_items(count, size, r, equal) for r in range(size)]
    together = sorted(i for s in shards for i in s)
    assert len(together) == len(set(together))
    if equal:
        assert {len(s) for s in shards} == {count // size}
        assert len(together) == count - plan.dropped(count, size)
    else:
        assert together == list(range(count))


def test_bad_ranks_are_refused():
    with pytest.raises(ValueError, match="rank must be"):
        plan.shard_length(4, 2, 2)
    with pytest.raises(ValueError, match="size must be"):
        plan.shard_length(4, 0, 0)


def test_shard_dataset_takes_disjoint_shards_whatever_each_rank_seed():
    import tensorflow as tf

    from hvdkeras.inputs.tf_data import shard_dataset, shuffles

    seen = []
    for rank in range(3):
        tf.random.set_seed(100 + rank)
        ds = shard_dataset(tf.data.Dataset.range(30), shuffle_buffer=30, seed=1, rank=rank,
                           size=3)
        seen += [int(v) for v in ds]
    assert sorted(seen) == list(range(30))
    assert shuffles(tf.data.Dataset.range(3).shuffle(3).batch(2))
    assert not shuffles(tf.data.Dataset.range(3).batch(2))


def test_shard_arrays_and_py_dataset_with_a_given_rank():
    from hvdkeras.inputs.arrays import shard_arrays

    x = np.arange(10)
    parts = [shard_arrays(x, rank=r, size=3) for r in range(3)]
    assert [p.tolist() for p in parts] == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    a, b = shard_arrays(x, x * 2, rank=1, size=3, equal_shards=False)
    assert a.tolist() == [1, 4, 7] and b.tolist() == [2, 8, 14]
    with pytest.raises(ValueError, match="same number of rows"):
        shard_arrays(x, x[:3], rank=0, size=2)

"""The data-sharding helpers on real ranks whose random seeds differ on
purpose (Note [shard before shuffling] in hvdkeras/inputs/__init__.py):
every row is seen exactly once per epoch across the ranks, under tf.data,
a torch DataLoader, NumPy arrays and a PyDataset, and every rank runs the
same number of steps.
"""

import importlib.util

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd

ROWS = 48  # splits evenly over 2 and 3 ranks, and so do its 12 batches of 4
EPOCHS = 3


@pytest.fixture(autouse=True)
def seeds_differ_per_rank():
    """What users do so that ranks draw different noise (and what breaks
    shuffle-then-shard)."""
    keras.utils.set_random_seed(1234 + hvd.rank())
    yield
    keras.utils.set_random_seed(0)


def _assert_every_row_once(seen, what):
    """`seen`: this rank's rows of one epoch."""
    everyone = hvd.allgather_object(sorted(int(r) for r in seen), name=f"rows_{what}")
    lengths = {len(rows) for rows in everyone}
    assert len(lengths) == 1, f"{what}: ranks saw {[len(r) for r in everyone]} rows"
    together = sorted(r for rows in everyone for r in rows)
    assert together == list(range(ROWS)), f"{what}: rows seen {together}"


def test_the_pitfall_is_real_shuffling_before_sharding_overlaps():
    """Without the helper: shuffle with a fixed op seed, then shard. The
    ranks' global seeds differ, so their orders differ and the shards overlap."""
    ds = tf.data.Dataset.range(ROWS).shuffle(ROWS, seed=7).shard(hvd.size(), hvd.rank())
    everyone = hvd.allgather_object(sorted(int(r) for r in ds), name="pitfall")
    assert len({r for rows in everyone for r in rows}) < ROWS


def test_tf_data_shards_see_every_row_once_per_epoch():
    ds = hvd.shard_dataset(tf.data.Dataset.range(ROWS), shuffle_buffer=ROWS, seed=7)
    orders = []
    for epoch in range(EPOCHS):
        rows = [int(r) for r in ds]
        _assert_every_row_once(rows, f"tf.data epoch {epoch}")
        orders.append(rows)
    assert orders[0] != orders[1], "each epoch should draw a new order"


def test_tf_data_pipeline_that_shuffles_first_is_refused():
    with pytest.raises(ValueError, match="shuffles already"):
        hvd.shard_dataset(tf.data.Dataset.range(ROWS).shuffle(8).map(lambda v: v * 2))


def test_tf_data_equal_shards_give_every_rank_the_same_steps():
    ds = hvd.shard_dataset(tf.data.Dataset.range(ROWS + hvd.size() - 1))
    assert hvd.allgather_object(int(ds.cardinality()), name="cardinality") == \
        [ROWS // hvd.size()] * hvd.size()


def test_fit_on_sharded_numpy_arrays_sees_every_row_once_per_epoch():
    x = np.arange(ROWS, dtype="float32").reshape(-1, 1)
    x_mine, y_mine = hvd.shard_arrays(x, np.zeros((ROWS, 1), "float32"))
    seen = []

    class Identity(keras.Model):
        def train_step(self, data):
            seen.append(keras.ops.convert_to_numpy(data[0]).ravel())
            return {"rows": keras.ops.sum(data[0])}

    model = Identity()
    model.compile(optimizer="sgd", run_eagerly=True)
    model.fit(x_mine, y_mine, batch_size=4, epochs=EPOCHS, shuffle=True, verbose=0)
    per_epoch = len(seen) // EPOCHS
    for epoch in range(EPOCHS):
        _assert_every_row_once(np.concatenate(seen[epoch * per_epoch:(epoch + 1) * per_epoch]),
                               f"numpy epoch {epoch}")


class _Batches(keras.utils.PyDataset):
    def __len__(self):
        return ROWS // 4

    def __getitem__(self, index):
        rows = np.arange(index * 4, index * 4 + 4, dtype="float32").reshape(-1, 1)
        return rows, np.zeros_like(rows)


def test_sharded_py_dataset_deals_out_every_batch_once():
    shard = hvd.ShardedPyDataset(_Batches())
    assert len(shard) == (ROWS // 4) // hvd.size()
    _assert_every_row_once(np.concatenate([shard[i][0].ravel() for i in range(len(shard))]),
                           "PyDataset")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_sampler_sees_every_row_once_per_epoch_and_follows_fit():
    import torch

    torch.manual_seed(1234 + hvd.rank())
    dataset = torch.utils.data.TensorDataset(torch.arange(ROWS, dtype=torch.float32)[:, None])
    sampler = hvd.DistributedSampler(dataset, shuffle=True, seed=3)
    assert (sampler.num_replicas, sampler.rank) == (hvd.size(), hvd.rank())
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
    orders = []
    callback = hvd.callbacks.DataEpochCallback()
    for epoch in range(EPOCHS):
        callback.on_epoch_begin(epoch)
        rows = [int(v) for batch in loader for v in batch[0].ravel()]
        _assert_every_row_once(rows, f"DataLoader epoch {epoch}")
        orders.append(rows)
    assert orders[0] != orders[1], "set_epoch should give each epoch a new order"
    assert any(isinstance(c, hvd.callbacks.DataEpochCallback)
               for c in hvd.callbacks.standard_callbacks())

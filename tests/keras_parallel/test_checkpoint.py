"""Rank-0 checkpoints within one job: who writes, pruning, best-only state,
and resuming past damaged files. (Restarting a real job after a stop and
after a crash mid-write is tested by tests/test_keras_mpi.py with scripts.)"""

import os

import keras
import numpy as np
import pytest

import hvdkeras as hvd
from keras_helpers import (assert_weights_close, mlp, regression_data, shard, spread_over_ranks,
                           variable_values)


def _model(seed=61):
    model = mlp(seed=seed)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    return model


def _fit(model, directory, epochs, initial_epoch=0, extra=(), **options):
    x, y = regression_data(seed=62 + hvd.rank(), rows=8)
    model.fit(x, y, batch_size=4, epochs=epochs, initial_epoch=initial_epoch, verbose=0,
              shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), *extra,
                         hvd.callbacks.CheckpointCallback(directory, **options)])


def _rank_dir(tmp_path):
    # Separate directories per rank: rank 1's must stay untouched.
    return str(tmp_path / f"checkpoints-rank{hvd.rank()}")


def test_only_rank_zero_writes_and_old_checkpoints_are_pruned(tmp_path):
    directory = _rank_dir(tmp_path)
    model = _model()
    _fit(model, directory, epochs=3, keep_last=2)
    if hvd.rank() == 0:
        assert sorted(os.listdir(directory)) == ["epoch-00002.keras", "epoch-00003.keras"]
        loaded = keras.saving.load_model(os.path.join(directory, "epoch-00003.keras"))
        for a, b in zip(loaded.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)
        assert int(loaded.optimizer.iterations.numpy()) == 6
    else:
        assert not os.path.exists(directory)


def test_restore_skips_damaged_files_and_syncs_every_rank(tmp_path):
    directory = _rank_dir(tmp_path)
    trained = _model()
    _fit(trained, directory, epochs=2, keep_last=None)
    if hvd.rank() == 0:
        # A truncated file under a final name (as a non-atomic writer leaves
        # it) and a leftover temporary file must both be passed over.
        with open(os.path.join(directory, "epoch-00002.keras"), "rb") as f:
            data = f.read()
        with open(os.path.join(directory, "epoch-00003.keras"), "wb") as f:
            f.write(data[: len(data) // 2])
        with open(os.path.join(directory, ".tmp-123-epoch-00004.keras"), "wb") as f:
            f.write(data[:100])
    fresh = _model(seed=70 + hvd.rank())    # different weights on every rank
    epoch = hvd.restore_from_checkpoint(fresh, directory)
    assert epoch == 2
    state = variable_values(fresh.variables) + variable_values(fresh.optimizer.variables)
    assert spread_over_ranks(state, "t_restored") == 0
    if hvd.rank() == 0:
        expected = variable_values(trained.variables) + variable_values(trained.optimizer.variables)
        for got, want in zip(state, expected):
            np.testing.assert_array_equal(got, want)


def test_restore_without_checkpoints_starts_at_zero_in_sync(tmp_path):
    model = _model(seed=80 + hvd.rank())
    assert hvd.restore_from_checkpoint(model, str(tmp_path / "nothing-here")) == 0
    assert spread_over_ranks(model.get_weights(), "t_no_ckpt") == 0


def test_a_checkpoint_that_does_not_fit_fails_on_every_rank(tmp_path):
    directory = _rank_dir(tmp_path)
    _fit(_model(), directory, epochs=1)
    other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    other.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)), loss="mse")
    with pytest.raises(RuntimeError, match="could not load the newest checkpoint"):
        hvd.restore_from_checkpoint(other, directory, verbose=0)


class Score(keras.callbacks.Callback):
    """Writes a scripted 'score' into the epoch logs."""

    def __init__(self, values):
        super().__init__()
        self.values = values

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.values[epoch]


def test_save_best_only_keeps_its_best_across_restarts(tmp_path):
    directory = _rank_dir(tmp_path)
    scores = [3.0, 1.0, 2.0, 0.5, 0.7, 0.4]
    options = dict(save_best_only=True, monitor="score", keep_last=None)
    model = _model()
    _fit(model, directory, epochs=4, extra=[Score(scores)], **options)
    # A new callback (as after a restart) must remember that 0.5 is the best.
    _fit(model, directory, epochs=6, initial_epoch=4, extra=[Score(scores)], **options)
    if hvd.rank() == 0:
        saved = sorted(n for n in os.listdir(directory) if n.endswith(".keras"))
        assert saved == ["epoch-00001.keras", "epoch-00002.keras", "epoch-00004.keras",
                         "epoch-00006.keras"]


def test_load_model_continues_training_distributed(tmp_path_factory):
    """hvd.load_model: the saved optimizer state is kept and made distributed, so
    training on 2 ranks continues exactly like one process on the global batch."""
    steps, per_rank = 3, 4
    x, y = regression_data(seed=21, rows=2 * steps * hvd.size() * per_rank)
    first, second = x[: len(x) // 2], x[len(x) // 2:]
    first_y, second_y = y[: len(y) // 2], y[len(y) // 2:]
    path = str(tmp_path_factory.getbasetemp() / "load_model_shared.keras")
    if hvd.rank() == 0:
        saved = mlp(31)
        saved.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
        saved.fit(first, first_y, batch_size=hvd.size() * per_rank, shuffle=False, verbose=0)
        hvd.save_model_atomic(saved, path)
    shared = hvd.broadcast_object(path, root_rank=0, name="load_model_path")  # once written
    model = hvd.load_model(shared)
    assert hvd.is_distributed(model.optimizer)
    assert int(model.optimizer.iterations.numpy()) == steps
    model.fit(shard(second, steps, per_rank), shard(second_y, steps, per_rank),
              batch_size=per_rank, shuffle=False, verbose=0)
    reference = keras.models.load_model(shared)
    reference.fit(second, second_y, batch_size=hvd.size() * per_rank, shuffle=False, verbose=0)
    assert_weights_close(model.get_weights(), reference.get_weights(), "after load_model")

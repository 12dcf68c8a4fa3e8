"""Horovod's training names on real ranks: PartialDistributedOptimizer and
its tape, a DistributedOptimizer on a process set, BestModelCheckpoint and
the elastic state objects. Values are checked against what each rank
contributed."""

from __future__ import annotations

import os
import pickle

import keras
import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import hvdkeras as hvd

RANK, SIZE = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def two_layer_model() -> keras.Model:
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="shared"),
                             keras.layers.Dense(1, name="head")])


def rank_gradients(model: keras.Model):
    """Gradients of a loss that differs per rank: (rank + 1) * sum of outputs."""
    x = tf.ones([1, 3])
    with tf.GradientTape() as tape:
        loss = float(RANK + 1) * tf.reduce_sum(model(x))
    return tape, loss


@pytest.mark.parametrize("scale", [True, False], ids=["scaled", "unscaled"])
def test_partial_distributed_tape_keeps_local_layers_local(scale):
    model = two_layer_model()
    tape, loss = rank_gradients(model)
    local = tape.gradient(loss, model.trainable_variables)  # this rank's own gradients
    tape, loss = rank_gradients(model)
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[model.get_layer("head")],
                                              scale_local_gradients=scale,
                                              name=f"partial_tape_{scale}")
    got = tape.gradient(loss, model.trainable_variables)
    mean_factor = sum(r + 1 for r in range(SIZE)) / SIZE / (RANK + 1)
    for var, g, own in zip(model.trainable_variables, got, local):
        if "/head/" in var.path:
            want = own.numpy() / SIZE if scale else own.numpy()
        else:
            want = own.numpy() * mean_factor
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-6, err_msg=var.path)


def test_partial_distributed_optimizer_steps_shared_layers_alike():
    model = two_layer_model()
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(1.0),
                                          local_layers=model.get_layer("head"),
                                          scale_local_gradients=False)
    tape, loss = rank_gradients(model)
    grads = tape.gradient(loss, model.trainable_variables)
    before = [v.numpy() for v in model.trainable_variables]
    opt.apply(grads, model.trainable_variables)
    mean_factor = sum(r + 1 for r in range(SIZE)) / SIZE / (RANK + 1)
    for var, g, b in zip(model.trainable_variables, grads, before):
        factor = 1.0 if "/head/" in var.path else mean_factor
        np.testing.assert_allclose(var.numpy(), b - g.numpy() * factor, rtol=1e-6,
                                   err_msg=var.path)
    with pytest.raises(ValueError, match="must be Keras layers"):
        hvd.PartialDistributedOptimizer(keras.optimizers.SGD(), local_layers=["head"])


def test_distributed_optimizer_on_a_process_set():
    """Only the set's members average, among themselves."""
    if SIZE < 2:
        pytest.skip("a proper process set needs 2+ ranks")
    members = list(range(SIZE - 1))
    subset = hvd.add_process_set(members)
    try:
        if subset.included():
            model = two_layer_model()
            opt = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), process_set=subset,
                                           name="subset_opt")
            tape, loss = rank_gradients(model)
            grads = tape.gradient(loss, model.trainable_variables)
            before = [v.numpy() for v in model.trainable_variables]
            opt.apply(grads, model.trainable_variables)
            factor = sum(r + 1 for r in members) / len(members) / (RANK + 1)
            for var, g, b in zip(model.trainable_variables, grads, before):
                np.testing.assert_allclose(var.numpy(), b - g.numpy() * factor, rtol=1e-6)
    finally:
        hvd.remove_process_set(subset)


def test_best_model_checkpoint_writes_only_improvements_on_rank_0(tmp_path_factory):
    # A directory per rank: a file appears only where that rank wrote it.
    path = os.path.join(str(tmp_path_factory.mktemp(f"best{RANK}")), "best.keras")
    callback = hvd.callbacks.BestModelCheckpoint(path, monitor="loss", mode="min")
    model = two_layer_model()
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_epoch_end(0, {"loss": 2.0})
    assert os.path.exists(path) == (RANK == 0)
    if RANK == 0:
        stamp = os.stat(path).st_mtime_ns
    callback.on_epoch_end(1, {"loss": 3.0})  # worse: not written
    if RANK == 0:
        assert os.stat(path).st_mtime_ns == stamp and callback.best == 2.0
        assert keras.models.load_model(path).count_params() == model.count_params()
    with pytest.raises(ValueError, match="no filepath"):
        hvd.callbacks.BestModelCheckpoint().on_train_begin()
    with pytest.raises(ValueError, match="save_freq"):
        hvd.callbacks.BestModelCheckpoint(path, save_freq=10)


def test_elastic_state_commit_restore_sync(tmp_path_factory, monkeypatch):
    # A directory per rank: a commit appears only where that rank wrote it,
    # and only rank 0's is read back.
    directory = str(tmp_path_factory.mktemp(f"elastic{RANK}"))
    monkeypatch.setenv("HVDKERAS_ELASTIC_STATE_DIR", directory)
    model = two_layer_model()
    for v in model.trainable_variables:  # ranks start apart
        v.assign(v + float(RANK))
    state = hvd.elastic.TensorFlowKerasState(model, epoch=RANK, batch=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(1)])

    @hvd.elastic.run
    def train(state, increment):
        state.epoch += increment
        state.commit()
        return state.epoch

    assert train(state, 2) == 2  # synced to rank 0's epoch 0, then + 2
    root = [v.numpy() for v in two_layer_model().trainable_variables]
    for v, want in zip(model.trainable_variables, root):
        np.testing.assert_array_equal(v.numpy(), want)  # rank 0's weights everywhere
    assert os.path.exists(os.path.join(directory, "elastic-state.pkl")) == (RANK == 0)
    model.trainable_variables[0].assign(tf.zeros_like(model.trainable_variables[0]))
    state.epoch = 99
    state.restore()
    assert state.epoch == 2
    np.testing.assert_array_equal(model.trainable_variables[0].numpy(), root[0])
    # A restarted job: a fresh state object resumes from the written commit.
    fresh = hvd.elastic.TensorFlowKerasState(two_layer_model(), epoch=0, batch=0)
    fresh.register_reset_callbacks([lambda: resets.append(2)])
    assert train(fresh, 1) == 3
    assert resets == [2]
    if RANK == 0:
        with open(os.path.join(directory, "elastic-state.pkl"), "rb") as f:
            assert pickle.load(f)["values"] == {"epoch": 3, "batch": 0}


def test_elastic_keras_callbacks_track_position():
    state = hvd.elastic.ObjectState(epoch=0, batch=0)
    commits = []
    state.commit = lambda: commits.append((state.epoch, state.batch))
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=2)]
    for epoch in range(2):
        for batch in range(3):
            for c in callbacks:
                c.on_train_batch_end(batch)
        for c in callbacks:
            c.on_epoch_end(epoch)
    assert (state.epoch, state.batch) == (2, 0)
    assert commits == [(0, 2), (1, 0), (1, 2), (2, 0)]

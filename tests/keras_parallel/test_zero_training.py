"""Sharded optimizer state in `model.fit`: N ranks equal one process on the
global batch, checkpoints are normal unsharded files (equal to stage 0's),
and resuming restores every rank's shard exactly.

Runs at 2 ranks (tests/test_keras_mpi.py) and at 4 (tests/test_zero.py)."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from keras_helpers import (assert_weights_close, assert_weights_moved, fit_distributed, mlp,
                           regression_data, run_reference, shard, variable_values)

tf.config.experimental.enable_op_determinism()

B, STEPS, SEED = 4, 5, 23
OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw_global_clipnorm": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1,
                                                            global_clipnorm=0.05),
}


def skip_stage_one_beyond_two_ranks(stage):
    """Stage 1 shards the optimizer state as stage 2 does and reduces whole
    gradients as stage 0 does, so what these optimizer-by-optimizer cases
    check of it at 4 ranks the other stages' cases already cover: its cases
    run at 2 ranks, stages 2 and 3 at 4 as well (saving about a minute of
    the 4-rank run). The tests that compare stages at every size keep it."""
    if stage == 1 and hvd.size() > 2:
        pytest.skip("stage 1 of this case runs at 2 ranks")


def _compiled(optimizer):
    model = mlp(SEED)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _data(steps=STEPS):
    return regression_data(seed=9, rows=steps * hvd.size() * B)


def _full_state(model, tmp_path, name):
    """The model's weights and whole optimizer state, as a normal file holds
    them: saved through hvdkeras on rank 0, loaded by plain Keras."""
    path = os.path.join(str(tmp_path), f"{name}.keras")
    with hvd.gathered_optimizer_state(model):
        if hvd.rank() == 0:
            model.save(path)
    state = None
    if hvd.rank() == 0:
        loaded = keras.models.load_model(path)
        plain = type(loaded.optimizer)
        assert plain is getattr(keras.optimizers, plain.__name__), plain  # Keras's own class
        state = (loaded.get_weights(), variable_values(loaded.optimizer.variables))
    return hvd.broadcast_object(state, root_rank=0, name=f"state_{name}")


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_fit_matches_one_process_and_saves_the_whole_state(kind, stage, tmp_path):
    skip_stage_one_beyond_two_ranks(stage)
    x, y = _data()
    model = _compiled(hvd.DistributedOptimizer(OPTIMIZERS[kind](), zero_stage=stage))
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    reference = run_reference(lambda: _compiled(OPTIMIZERS[kind]()), x, y,
                              batch_size=hvd.size() * B)
    assert_weights_moved(initial, reference.get_weights(), kind)
    assert_weights_close(model.get_weights(), reference.get_weights(), f"{kind} weights")
    weights, optimizer_state = _full_state(model, tmp_path, f"{kind}{stage}")
    assert_weights_close(weights, reference.get_weights(), f"{kind} saved weights")
    assert_weights_close(optimizer_state, variable_values(reference.optimizer.variables),
                         f"{kind} saved optimizer state")


def _fit_with_checkpoints(model, directory, epochs, initial_epoch=0):
    x, y = regression_data(seed=40 + hvd.rank(), rows=12)
    model.fit(x, y, batch_size=4, epochs=epochs, initial_epoch=initial_epoch, verbose=0,
              shuffle=False, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                        hvd.callbacks.CheckpointCallback(directory)])


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_checkpoint_resume_continues_exactly(stage, tmp_path):
    directory = str(tmp_path / f"ckpt{stage}")
    make = lambda: _compiled(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),  # noqa: E731
                                                      zero_stage=stage))
    uninterrupted = make()
    _fit_with_checkpoints(uninterrupted, str(tmp_path / f"u{stage}"), epochs=3)

    first = make()
    _fit_with_checkpoints(first, directory, epochs=2)
    if hvd.rank() == 0:
        assert sorted(os.listdir(directory)) == ["epoch-00001.keras", "epoch-00002.keras"]
    saved = _full_state(first, tmp_path, f"first{stage}")

    resumed = make()
    epoch = hvd.restore_from_checkpoint(resumed, directory, verbose=0)
    assert epoch == 2
    restored = _full_state(resumed, tmp_path, f"resumed{stage}")
    for got, want in zip(restored[1], saved[1]):
        np.testing.assert_array_equal(got, want)  # every rank's shard, bit for bit
    _fit_with_checkpoints(resumed, directory, epochs=3, initial_epoch=2)
    assert_weights_close(resumed.get_weights(), uninterrupted.get_weights(), "resumed weights")


@pytest.mark.parametrize("stage", [1, 3])
def test_rank_zero_alone_cannot_save_sharded_state(stage, tmp_path):
    """Horovod's idiom, a save on rank 0 alone, is refused at once (at stage
    3 before any gather starts, rather than waiting on one no other rank
    makes); every rank then goes on in step."""
    if hvd.size() == 1:
        pytest.skip("with one rank nothing is sharded")
    model = _compiled(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=stage))
    x, y = _data(1)
    fit_distributed(model, shard(x, 1, B), shard(y, 1, B), batch_size=B)
    if hvd.rank() == 0:
        with pytest.raises(RuntimeError, match="gathered_optimizer_state"):
            model.save(os.path.join(str(tmp_path), "alone.keras"))
    values = [float(np.sum(v)) for v in model.get_weights()]
    assert hvd.allgather_object(values, name="after_refused_save") == [values] * hvd.size()


@pytest.mark.parametrize("stage", [2, 3])
def test_best_model_checkpoint_saves_the_whole_sharded_state(stage, tmp_path):
    """Per-rank logs differ here (no MetricAverageCallback): rank 0 decides and
    every rank joins its save, so nobody waits and the file is complete."""
    model = _compiled(hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=stage))
    path = os.path.join(str(tmp_path), f"best{stage}.keras")
    x, y = regression_data(seed=70 + hvd.rank(), rows=12)
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.BestModelCheckpoint(path, monitor="loss", mode="min")])
    weights, now = _full_state(model, tmp_path, f"best_now{stage}")
    if hvd.rank() == 0:
        best = keras.models.load_model(path)
        assert [v.shape for v in variable_values(best.optimizer.variables)] == \
            [v.shape for v in now]
        assert [w.shape for w in best.get_weights()] == [w.shape for w in weights]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_steps_per_execution(stage):
    """Several steps per tf.function call (a loop in the graph): the sharded
    step's explicitly named collectives repeat in order and stay exact."""
    steps = 6
    x, y = _data(steps)
    model = mlp(SEED)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                     zero_stage=stage),
                  loss="mse", steps_per_execution=3)
    fit_distributed(model, shard(x, steps, B), shard(y, steps, B), batch_size=B)
    reference = run_reference(lambda: _compiled(keras.optimizers.Adam(0.01)), x, y,
                              batch_size=hvd.size() * B)
    assert_weights_close(model.get_weights(), reference.get_weights(),
                         f"steps_per_execution stage {stage}")


def hvd_storage_shape(variable):
    """The shape of what a model variable stores on this rank (its rows at stage 3)."""
    return tuple(variable._value.shape)


def _wide_mlp(optimizer):
    """96-512-384-10: its 512x384 kernel is most of the parameters."""
    keras.utils.set_random_seed(SEED)
    model = keras.Sequential([keras.Input((96,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(384, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def assert_every_stage_equals_stage_zero(weights):
    """`weights[stage]` of stages 1-3 equal `weights[0]` bit for bit."""
    for stage in (1, 2, 3):
        for i, (got, want) in enumerate(zip(weights[stage], weights[0])):
            differ = int(np.sum(got != want))
            assert differ == 0, (f"stage {stage}, weight {i}: {differ} of {got.size} entries "
                                 f"differ from stage 0's, by up to {np.max(np.abs(got - want))}")


def test_every_stage_gives_stage_zero_weights_bit_for_bit():
    """Adam over 64 steps amplifies any difference in how the ranks' gradients
    are added: the reduce-scatter (stage 2) must add them as the allreduce
    (stages 0 and 1) does (Note [one summation order on a host])."""
    steps, per_rank = 64, 16
    rng = np.random.default_rng(5)
    rows = steps * hvd.size() * per_rank
    x = rng.normal(size=(rows, 96)).astype("float32")
    y = rng.normal(size=(rows, 10)).astype("float32")
    weights = {}
    for stage in (0, 1, 2, 3):
        model = _wide_mlp(hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3),
                                                   zero_stage=stage))
        fit_distributed(model, shard(x, steps, per_rank), shard(y, steps, per_rank),
                        batch_size=per_rank)
        weights[stage] = model.get_weights()
    assert_weights_moved([w for w in _wide_mlp("adam").get_weights()], weights[0], "stage 0")
    assert_every_stage_equals_stage_zero(weights)


def _embedding_model(optimizer):
    """A 2000x16 table is most of the parameters, so every stage cuts it."""
    keras.utils.set_random_seed(SEED)
    model = keras.Sequential([keras.Input((6,), dtype="int32"),
                              keras.layers.Embedding(2000, 16),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def test_sparse_embedding_gradients_give_stage_zero_weights_at_every_stage():
    """Keras's Adam updates only the rows a sparse gradient names, and squares
    repeated rows one by one: each stage must hand the holders of the table's
    rows the gathered sparse rows, as stage 0 hands them to every rank (a
    densified gradient at stage 3 moved the table by 1.5e-3 in two steps)."""
    steps, per_rank = 6, 8
    rng = np.random.default_rng(9)
    rows = steps * hvd.size() * per_rank
    # Few distinct ids, so rows repeat within a rank and across ranks.
    x = rng.integers(0, 40, size=(rows, 6)).astype("int32")
    y = rng.normal(size=(rows, 3)).astype("float32")
    weights = {}
    for stage in (0, 1, 2, 3):
        model = _embedding_model(hvd.DistributedOptimizer(keras.optimizers.Adam(1e-2),
                                                          zero_stage=stage))
        fit_distributed(model, shard(x, steps, per_rank), shard(y, steps, per_rank),
                        batch_size=per_rank)
        if stage == 3:
            held = hvd_storage_shape(model.layers[0].embeddings)[0]
            assert max(hvd.allgather_object(held, name="embedding_rows")) < 2000
        weights[stage] = model.get_weights()
    start = _embedding_model("adam").get_weights()
    assert_weights_moved(start, weights[0], "stage 0")
    assert np.sum(np.any(start[0] != weights[0][0], axis=1)) <= 40  # only the rows used
    assert_every_stage_equals_stage_zero(weights)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_dominant_variable_is_cut_so_each_rank_holds_its_share(stage):
    """The wide MLP's 512x384 kernel is 78% of its parameters: whole-variable
    shards would leave one rank 0.78 of the state; cut into row blocks
    (Note [split variables]) the fullest rank holds 1/N + 2% at most."""
    x = np.zeros((hvd.size() * 4, 96), "float32")
    y = np.zeros((hvd.size() * 4, 10), "float32")
    model = _wide_mlp(hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3), zero_stage=stage))
    fit_distributed(model, shard(x, 1, 4), shard(y, 1, 4), batch_size=4)
    reference = _wide_mlp(keras.optimizers.Adam(1e-3))
    reference.optimizer.build(reference.trainable_variables)
    held = sum(int(np.prod(v.shape)) * 4 for v in model.optimizer.variables)
    whole = sum(int(np.prod(v.shape)) * 4 for v in reference.optimizer.variables)
    fullest = max(hvd.allgather_object(held, name=f"held_{stage}"))
    assert fullest <= whole * (1 / hvd.size() + 0.02), (fullest, whole)
    # At stage 3 the weights themselves: what each rank's model variables store.
    stored = sum(int(np.prod(hvd_storage_shape(v))) * 4 for v in model.trainable_variables)
    weights = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    fullest = max(hvd.allgather_object(stored, name=f"stored_{stage}"))
    assert fullest <= weights * ((1 / hvd.size() + 0.02) if stage == 3 else 1), (fullest, weights)
    assert [w.shape for w in model.get_weights()] == [tuple(v.shape) for v in model.weights]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_cut_variables_save_and_resume_as_whole_ones(stage, tmp_path):
    """A checkpoint of cut state is the normal file stage 0 writes, bit for
    bit, and resuming gives every rank its rows of it back."""
    steps, per_rank = 3, 8
    rng = np.random.default_rng(8)
    x = rng.normal(size=(steps * hvd.size() * per_rank, 96)).astype("float32")
    y = rng.normal(size=(steps * hvd.size() * per_rank, 10)).astype("float32")

    def fit(model, directory):
        fit_distributed(model, shard(x, steps, per_rank), shard(y, steps, per_rank),
                        batch_size=per_rank, epochs=2,
                        callbacks=[hvd.callbacks.CheckpointCallback(directory)])

    def make(zero_stage):
        return _wide_mlp(hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3),
                                                  zero_stage=zero_stage))

    plain = make(0)
    fit(plain, str(tmp_path / "plain"))
    cut = make(stage)
    directory = str(tmp_path / f"cut{stage}")
    fit(cut, directory)
    if hvd.size() > 1:
        assert cut.optimizer._hvdkeras_shards.pieces, "the kernel should have been cut"
    want = _full_state(plain, tmp_path, f"plain{stage}")
    saved = _full_state(cut, tmp_path, f"cut{stage}")
    for got, expected in zip(saved[0] + saved[1], want[0] + want[1]):
        np.testing.assert_array_equal(got, expected)
    resumed = make(stage)
    assert hvd.restore_from_checkpoint(resumed, directory, verbose=0) == 2
    restored = _full_state(resumed, tmp_path, f"resumed{stage}")
    for got, expected in zip(restored[0] + restored[1], saved[0] + saved[1]):
        np.testing.assert_array_equal(got, expected)


CUT_OPTIMIZERS = {
    "adamw_global_clipnorm": lambda: keras.optimizers.AdamW(1e-3, weight_decay=0.1,
                                                            global_clipnorm=0.05),
    "adam_ema": lambda: keras.optimizers.Adam(1e-3, use_ema=True, ema_overwrite_frequency=2),
    "adam_accumulating": lambda: keras.optimizers.Adam(1e-3, gradient_accumulation_steps=2),
    "loss_scaled_sgd": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.01, momentum=0.9)),
    "nadam": lambda: keras.optimizers.Nadam(1e-3),
    "rmsprop_centered": lambda: keras.optimizers.RMSprop(1e-3, centered=True),
    "lion": lambda: keras.optimizers.Lion(1e-4),
    "adagrad": lambda: keras.optimizers.Adagrad(1e-2),
}


# Beyond 2 ranks (tests/test_zero.py's 4-rank run) the kinds whose update of
# a piece reads more than that piece's own elements (the global norm, the
# EMA's and the accumulator's schedules, the loss scale's finite check
# across pieces) run; the purely elementwise ones run at 2 ranks, since
# which rank owns an element cannot change its update, and the layout at 4
# ranks is the same for every kind. HVDKERAS_ZERO_FOUR_RANKS_EVERYTHING=1
# runs them all at every size.
ELEMENTWISE_ONLY = ("nadam", "rmsprop_centered", "lion", "adagrad")


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("kind", list(CUT_OPTIMIZERS))
def test_cut_variables_keep_every_elementwise_feature(kind, stage):
    """Weight decay, global-norm clipping, EMA, Keras's accumulation and loss
    scaling on the cut kernel: the weights are stage 0's."""
    if stage == 3 and kind == "adam_ema":
        pytest.skip("zero_stage=3 refuses an EMA (test_stage_three_refuses_what_it_cannot_do)")
    skip_stage_one_beyond_two_ranks(stage)
    if (hvd.size() > 2 and kind in ELEMENTWISE_ONLY
            and os.environ.get("HVDKERAS_ZERO_FOUR_RANKS_EVERYTHING") != "1"):
        pytest.skip(f"{kind} is elementwise: beyond 2 ranks the other kinds cover the cut")
    steps, per_rank = 4, 8
    rng = np.random.default_rng(12)
    x = rng.normal(size=(steps * hvd.size() * per_rank, 96)).astype("float32")
    y = rng.normal(size=(steps * hvd.size() * per_rank, 10)).astype("float32")
    fitted = []
    for zero_stage in (0, stage):
        model = _wide_mlp(hvd.DistributedOptimizer(CUT_OPTIMIZERS[kind](), zero_stage=zero_stage))
        fit_distributed(model, shard(x, steps, per_rank), shard(y, steps, per_rank),
                        batch_size=per_rank)
        fitted.append(model)
    if hvd.size() > 1:
        holder = getattr(fitted[1].optimizer, "inner_optimizer", fitted[1].optimizer)
        assert holder._hvdkeras_shards.pieces, "the kernel should have been cut"
    for i, (got, want) in enumerate(zip(fitted[1].get_weights(), fitted[0].get_weights())):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=f"{kind} weight {i}")


def test_stage_three_reports_the_weights_gathered_per_step():
    """`EngineStatsCallback` shows what stage 3 gathers: each step gathers
    every weight once (and keeps it for the backward pass), so about the
    model's bytes (rows padded to even blocks add a little); stage 2 gathers
    nothing in its steps."""
    if hvd.size() == 1:
        pytest.skip("one rank holds its weights whole")
    steps, per_rank = 6, 8
    rng = np.random.default_rng(5)
    x = rng.normal(size=(steps * hvd.size() * per_rank, 96)).astype("float32")
    y = rng.normal(size=(steps * hvd.size() * per_rank, 10)).astype("float32")
    gathered = {}
    for stage in (2, 3):
        model = _wide_mlp(hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3), zero_stage=stage))
        history = fit_distributed(model, shard(x, steps, per_rank), shard(y, steps, per_rank),
                                  batch_size=per_rank,
                                  callbacks=[hvd.callbacks.EngineStatsCallback()])
        gathered[stage] = history.history.get("hvdkeras_gathered_mb_per_step", [0.0])[-1]
    weights = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables) / (1 << 20)
    assert gathered[2] == 0.0, gathered
    assert weights <= gathered[3] <= weights * 1.05, (gathered, weights)


def test_stage_three_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="EMA"):
        hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3, use_ema=True), zero_stage=3)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3), zero_stage=3,
                                 backward_passes_per_step=2)

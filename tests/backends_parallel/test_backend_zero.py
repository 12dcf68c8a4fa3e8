"""Sharded optimizer state (`zero_stage` 1 and 2) and sharded weights
(`zero_stage=3`) under KERAS_BACKEND=torch and jax: `model.fit` on N
ranks equals one process on the same global batches, each rank keeps
full-size slots for its own variables only (at stage 3 its rows of the
weights and their slots), a checkpoint is a normal file equal to the
unsharded optimizer's state, and resuming restores every rank's shard
exactly.

Runs at 2 and 3 ranks (tests/test_backends.py).
"""

import os

import keras
import numpy as np
import pytest

import hvdkeras as hvd
from hvdkeras import compat
from test_backend_training import GLOBAL_BATCH, data, distributed, make_model, my_slice, \
    reference, weights

STAGES = [1, 2, 3]
OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw_global_clipnorm": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01,
                                                            global_clipnorm=0.5),
    "nadam": lambda: keras.optimizers.Nadam(0.01),
    "loss_scaled_sgd": lambda: keras.optimizers.LossScaleOptimizer(
        keras.optimizers.SGD(0.05, momentum=0.9)),
    "adam_ema": lambda: keras.optimizers.Adam(0.01, use_ema=True, ema_overwrite_frequency=3),
    "accumulating_adam_clipnorm": lambda: keras.optimizers.Adam(
        0.01, gradient_accumulation_steps=2, global_clipnorm=0.5),
}

# At 3 ranks the shards are uneven: one optimizer with slots, and one whose
# global norm sums over the uneven shards. The others' rules (EMA, loss
# scaling, accumulation) do not depend on the layout and run at 2 ranks.
UNEVEN_LAYOUT_OPTIMIZERS = ("adam", "adamw_global_clipnorm")


def numpy_values(variables):
    return [keras.ops.convert_to_numpy(v) for v in variables]


def assert_close(got, want, what):
    assert len(got) == len(want), what
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-6, err_msg=f"{what} [{k}]")


def full_state(model, tmp_path, name):
    """Weights and the whole optimizer state as a normal file holds them:
    saved through hvdkeras on rank 0, loaded by plain Keras, sent to all."""
    path = os.path.join(str(tmp_path), f"{name}.keras")
    with hvd.gathered_optimizer_state(model):
        if hvd.rank() == 0:
            model.save(path)
    state = None
    if hvd.rank() == 0:
        loaded = keras.models.load_model(path)
        plain = type(loaded.optimizer)
        assert plain.__name__ == type(model.optimizer).__name__
        assert "hvdkeras" not in plain.__module__
        state = (numpy_values(loaded.weights), numpy_values(loaded.optimizer.variables))
    return hvd.broadcast_object(state, root_rank=0, name=f"state_{name}")


def holder_of(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def skip_passes_at_stage_three(stage, passes):
    if stage == 3 and passes > 1:
        pytest.skip("zero_stage=3 refuses backward_passes_per_step > 1 "
                    "(test_what_cannot_be_sharded_here_is_named)")


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_fit_equals_one_process_and_saves_the_whole_state(kind, stage, tmp_path):
    if hvd.size() > 2 and kind not in UNEVEN_LAYOUT_OPTIMIZERS:
        pytest.skip(f"{kind} runs at 2 ranks; the uneven layout of 3 runs with "
                    f"{', '.join(UNEVEN_LAYOUT_OPTIMIZERS)}")
    if stage == 3 and kind == "adam_ema":
        pytest.skip("zero_stage=3 refuses an EMA (test_what_cannot_be_sharded_here_is_named)")
    model, _ = distributed(OPTIMIZERS[kind](), zero_stage=stage)
    expected = reference(OPTIMIZERS[kind]())
    assert_close(weights(model), weights(expected), f"{kind} weights")
    saved_weights, saved_state = full_state(model, tmp_path, f"{kind}{stage}")
    assert_close(saved_weights, weights(expected), f"{kind} saved weights")
    assert_close(saved_state, numpy_values(expected.optimizer.variables),
                 f"{kind} saved optimizer state")


@pytest.mark.parametrize("stage", STAGES)
def test_each_rank_keeps_full_slots_for_its_own_variables_only(stage):
    if stage == 3:
        pytest.skip("stage 3 cuts even this model (test_stage_three_holds_rows_of_each_weight)")
    model, _ = distributed(keras.optimizers.Adam(0.01), zero_stage=stage)
    holder = holder_of(model.optimizer)
    owners = holder._hvdkeras_shards.owners
    assert hvd.allgather_object(owners, name=f"owners{stage}") == [owners] * hvd.size()
    assert sorted(set(owners)) == list(range(min(hvd.size(), len(owners))))
    for p, (variable, momentum) in enumerate(zip(model.trainable_variables, holder._momentums)):
        if owners[p] == hvd.rank():
            assert tuple(momentum.shape) == tuple(variable.shape), variable.path
        else:
            assert tuple(momentum.shape) == (1,) * len(variable.shape), variable.path
    mine = np.concatenate([w.ravel() for w in weights(model)])
    gathered = keras.ops.convert_to_numpy(hvd.allgather(keras.ops.convert_to_tensor(mine[None])))
    assert np.array_equal(gathered.min(0), gathered.max(0))


def _fit_with_checkpoints(model, directory, epochs, initial_epoch=0):
    x, y = data(seed=40)
    mine = my_slice(hvd.size(), hvd.rank())
    model.fit(x[mine], y[mine], batch_size=GLOBAL_BATCH // hvd.size(), epochs=epochs,
              initial_epoch=initial_epoch, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                         hvd.callbacks.CheckpointCallback(directory)])


def _compiled(stage, passes=1):
    model = make_model(seed=3 + 100 * hvd.rank())
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                     zero_stage=stage,
                                                     backward_passes_per_step=passes),
                  loss="mse")
    return model


@pytest.mark.parametrize("passes", [1, 2], ids=["every_pass", "two_passes"])
@pytest.mark.parametrize("stage", STAGES)
def test_checkpoint_resume_continues_exactly(stage, passes, tmp_path):
    """With two passes per update, an epoch's 4 batches are 2 whole windows,
    so a run resumed at an epoch boundary continues exactly."""
    skip_passes_at_stage_three(stage, passes)
    if GLOBAL_BATCH % hvd.size():
        pytest.skip(f"{GLOBAL_BATCH} does not split over {hvd.size()} ranks")
    directory = str(tmp_path / f"ckpt{stage}")
    uninterrupted = _compiled(stage, passes)
    _fit_with_checkpoints(uninterrupted, str(tmp_path / f"u{stage}"), epochs=3)

    first = _compiled(stage, passes)
    _fit_with_checkpoints(first, directory, epochs=2)
    saved = full_state(first, tmp_path, f"first{stage}")

    resumed = _compiled(stage, passes)
    assert hvd.restore_from_checkpoint(resumed, directory, verbose=0) == 2
    restored = full_state(resumed, tmp_path, f"resumed{stage}")
    for got, want in zip(restored[1], saved[1]):
        np.testing.assert_array_equal(got, want)  # every rank's shard, bit for bit
    _fit_with_checkpoints(resumed, directory, epochs=3, initial_epoch=2)
    assert_close(weights(resumed), weights(uninterrupted), "resumed weights")


@pytest.mark.parametrize("stage", STAGES[:1] + STAGES[2:])
def test_rank_zero_alone_cannot_save_sharded_state(stage, tmp_path):
    """Horovod's idiom, a save on rank 0 alone, is refused at once (at stage
    3 before any gather starts, rather than waiting on one no other rank
    makes); every rank then goes on in step."""
    if hvd.size() == 1:
        pytest.skip("with one rank nothing is sharded")
    model, _ = distributed(keras.optimizers.Adam(0.01), epochs=1, zero_stage=stage)
    if hvd.rank() == 0:
        with pytest.raises(RuntimeError, match="gathered_optimizer_state"):
            model.save(os.path.join(str(tmp_path), "alone.keras"))
    values = [float(np.sum(v)) for v in model.get_weights()]
    assert hvd.allgather_object(values, name="after_refused_save") == [values] * hvd.size()


@pytest.mark.parametrize("passes", [1, 2], ids=["every_pass", "two_passes"])
@pytest.mark.parametrize("stage", STAGES)
def test_a_rank_that_owns_nothing_keeps_in_step(stage, passes):
    """One trainable variable: the other ranks own none, yet take part in the
    global norm and the weight exchange, and count the same iterations (with
    two passes per update too, against Keras's accumulation of the mean)."""
    def one_variable_fit(optimizer, n, r, distributed_fit):
        x, y = data()
        keras.utils.set_random_seed(11 + (1000 * r if distributed_fit else 0))
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(1, use_bias=False)])
        model.compile(optimizer=optimizer, loss="mse")
        rows = my_slice(n, r) if distributed_fit else np.arange(len(x))
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)] if distributed_fit else []
        model.fit(x[rows], y[rows], batch_size=GLOBAL_BATCH // n, epochs=2, shuffle=False,
                  verbose=0, callbacks=callbacks)
        return model

    def make(**more):
        return keras.optimizers.Nadam(0.01, global_clipnorm=0.1, **more)

    if GLOBAL_BATCH % hvd.size():
        pytest.skip(f"{GLOBAL_BATCH} does not split over {hvd.size()} ranks")
    skip_passes_at_stage_three(stage, passes)
    accumulating = {"gradient_accumulation_steps": passes} if passes > 1 else {}
    got = one_variable_fit(hvd.DistributedOptimizer(make(), zero_stage=stage,
                                                    backward_passes_per_step=passes,
                                                    average_aggregated_gradients=True),
                           hvd.size(), hvd.rank(), True)
    want = one_variable_fit(make(**accumulating), 1, 0, False)
    assert_close(weights(got), weights(want), "one variable")
    assert int(keras.ops.convert_to_numpy(got.optimizer.iterations)) == \
        int(keras.ops.convert_to_numpy(want.optimizer.iterations))


@pytest.mark.parametrize("stage", STAGES)
def test_local_variables_stay_local(stage):
    """A variable registered local keeps its own gradient and full state on
    every rank; the others are averaged and sharded."""
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), zero_stage=stage,
                                         scale_local_gradients=False)
    model = make_model(seed=5)
    local = model.layers[0].bias
    optimizer.register_local_var(local)
    model.compile(optimizer=optimizer, loss="mse")
    x, y = data(seed=hvd.rank())
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    holder = holder_of(model.optimizer)
    position = [id(v) for v in model.trainable_variables].index(id(local))
    assert holder._hvdkeras_shards.owners[position] == hvd.sharding.REPLICATED
    assert tuple(holder._momentums[position].shape) == tuple(local.shape)  # on every rank
    biases = hvd.allgather_object(keras.ops.convert_to_numpy(local), name=f"bias{stage}")
    if hvd.size() > 1:
        assert not np.array_equal(biases[0], biases[1])  # each rank's own data
    kernel = keras.ops.convert_to_numpy(model.layers[0].kernel)
    for other in hvd.allgather_object(kernel, name=f"kernel{stage}"):
        np.testing.assert_array_equal(other, kernel)


def test_what_cannot_be_sharded_here_is_named():
    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3"):
        hvd.DistributedOptimizer(keras.optimizers.Adam(), zero_stage=4)
    with pytest.raises(ValueError, match="EMA"):
        hvd.DistributedOptimizer(keras.optimizers.Adam(use_ema=True), zero_stage=3)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(keras.optimizers.Adam(), zero_stage=3,
                                 backward_passes_per_step=2)
    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(keras.optimizers.Adam(), zero_stage=1, op=hvd.Adasum)
    built = keras.optimizers.Adam()
    built.build([keras.Variable(np.zeros(2, "float32"))])
    with pytest.raises(ValueError, match="is built"):
        hvd.DistributedOptimizer(built, zero_stage=1)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("average", [True, False], ids=["mean_of_passes", "sum_of_passes"])
def test_backward_passes_with_sharded_state_equal_one_process_accumulating(stage, average,
                                                                          tmp_path):
    """Two passes per update with sharded state equal one process using
    Keras's own accumulation on the same global batches (the sum of the
    passes is the mean at twice the learning rate), and the saved state is
    the plain optimizer's (no sums of passes in it, under JAX where they are
    optimizer variables too)."""
    skip_passes_at_stage_three(stage, 2)
    model, _ = distributed(keras.optimizers.SGD(0.05, momentum=0.9), zero_stage=stage,
                           backward_passes_per_step=2, average_aggregated_gradients=average)
    expected = reference(keras.optimizers.SGD(0.05 if average else 0.1, momentum=0.9,
                                              gradient_accumulation_steps=2))
    assert_close(weights(model), weights(expected), f"stage {stage} weights")
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4  # 8 passes / 2
    plain = keras.optimizers.SGD(0.05, momentum=0.9)
    plain.build(model.trainable_variables)
    _, saved_state = full_state(model, tmp_path, f"passes{stage}{average}")
    assert len(saved_state) == len(plain.variables)
    assert int(saved_state[0]) == 4  # the iteration count


@pytest.mark.parametrize("stage", STAGES)
def test_backward_passes_with_sharded_state_clip_the_window_total(stage):
    """Global-norm clipping sees the mean of the window's passes, reduced, as
    Keras's own accumulation does in one process."""
    skip_passes_at_stage_three(stage, 2)
    def make(**more):
        return keras.optimizers.AdamW(0.01, weight_decay=0.01, global_clipnorm=0.5, **more)

    model, _ = distributed(make(), zero_stage=stage, backward_passes_per_step=2,
                           average_aggregated_gradients=True)
    expected = reference(make(gradient_accumulation_steps=2))
    assert_close(weights(model), weights(expected), f"stage {stage} weights")


@pytest.mark.parametrize("stage", STAGES)
def test_backward_passes_with_sharded_state_move_bytes_on_update_passes_only(stage):
    """4 passes per update over 8 batches reduce as much as 2 single-pass steps."""
    skip_passes_at_stage_three(stage, 2)
    before = hvd.engine_stats()
    distributed(keras.optimizers.SGD(0.05), epochs=2, zero_stage=stage,
                backward_passes_per_step=4)
    accumulated = (hvd.engine_stats() - before).bytes_reduced
    before = hvd.engine_stats()
    distributed(keras.optimizers.SGD(0.05), epochs=1, zero_stage=stage)
    every_pass = (hvd.engine_stats() - before).bytes_reduced
    assert accumulated > 0 and 2 * accumulated == every_pass, (accumulated, every_pass)


@pytest.mark.parametrize("stage", STAGES)
def test_a_dominant_variable_is_cut_and_gives_stage_zero_results(stage, tmp_path):
    """96-512-384-10: whole variables would leave one rank 0.78 of the state;
    cut into row blocks (Note [split variables]) each rank holds about 1/N,
    and the weights and the saved state are stage 0's."""
    rng = np.random.default_rng(4)
    steps, per_rank = 3, 8
    x = rng.normal(size=(steps * hvd.size() * per_rank, 96)).astype("float32")
    y = rng.normal(size=(steps * hvd.size() * per_rank, 10)).astype("float32")
    mine = np.concatenate([np.arange(s * hvd.size() * per_rank + hvd.rank() * per_rank,
                                     s * hvd.size() * per_rank + (hvd.rank() + 1) * per_rank)
                           for s in range(steps)])

    def fit(zero_stage):
        keras.utils.set_random_seed(17)
        model = keras.Sequential([keras.Input((96,)), keras.layers.Dense(512, activation="relu"),
                                  keras.layers.Dense(384, activation="relu"),
                                  keras.layers.Dense(10)])
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3),
                                                         zero_stage=zero_stage), loss="mse")
        model.fit(x[mine], y[mine], batch_size=per_rank, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        return model

    plain, cut = fit(0), fit(stage)
    if hvd.size() > 1:
        assert holder_of(cut.optimizer)._hvdkeras_shards.pieces
    held = sum(int(np.prod(v.shape)) for v in holder_of(cut.optimizer).variables)
    whole = sum(int(np.prod(v.shape)) for v in holder_of(plain.optimizer).variables)
    assert max(hvd.allgather_object(held, name=f"held{stage}")) <= whole * (1 / hvd.size() + 0.02)
    assert_close(weights(cut), weights(plain), "cut weights")
    want, got = full_state(plain, tmp_path, f"plain{stage}"), full_state(cut, tmp_path, f"cut{stage}")
    assert_close(got[0] + got[1], want[0] + want[1], "cut saved state")


torch_only = pytest.mark.skipif(keras.backend.backend() != "torch",
                                reason="what only torch's stage 3 does (JAX's: test_jax_specific)")


def _wide_fit(zero_stage, steps=3, per_rank=8):
    """The 96-512-384-10 MLP, Adam, `steps` global batches; every rank starts
    from the same weights."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(steps * hvd.size() * per_rank, 96)).astype("float32")
    y = rng.normal(size=(steps * hvd.size() * per_rank, 10)).astype("float32")
    mine = np.concatenate([np.arange(s * hvd.size() * per_rank + hvd.rank() * per_rank,
                                     s * hvd.size() * per_rank + (hvd.rank() + 1) * per_rank)
                           for s in range(steps)])
    keras.utils.set_random_seed(19)
    model = keras.Sequential([keras.Input((96,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(384, activation="relu"), keras.layers.Dense(10)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-3),
                                                     zero_stage=zero_stage), loss="mse")
    model.fit(x[mine], y[mine], batch_size=per_rank, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return model


def test_stage_three_holds_rows_of_each_weight_and_gives_stage_zero_bits():
    """Each weight's rows are held once across the ranks, the backend's own
    storage is those rows (so the memory is the shard's; under torch the
    module's parameters), the fullest rank holds 1/N + 2% of the weights,
    and the weights are stage 0's bit for bit (the same units and summation
    order as stage 2)."""
    plain = _wide_fit(0)
    before = hvd.engine_stats()
    sharded = _wide_fit(3)
    gathered = (hvd.engine_stats() - before).bytes_gathered
    variables = sharded.trainable_variables
    stored_shapes = [tuple(compat.variable_storage(v).shape) for v in variables]
    held = [shape[0] if len(v.shape) else int(np.prod(shape))
            for v, shape in zip(variables, stored_shapes)]
    everyone = hvd.allgather_object(held, name="held_rows")
    for k, v in enumerate(variables):
        assert sum(rows[k] for rows in everyone) == (v.shape[0] if len(v.shape) else 1), v.path
    stored = sum(int(np.prod(shape)) for shape in stored_shapes)
    if keras.backend.backend() == "torch":
        assert sum(int(q.numel()) for q in sharded.parameters()) == stored
    whole = sum(int(np.prod(v.shape)) for v in variables)
    fullest = max(hvd.allgather_object(stored, name="stored"))
    assert fullest <= whole * (1 / hvd.size() + 0.02), (fullest, whole)
    # Every weight gathered once per step (3 steps) for the forward pass,
    # under torch once more for the backward pass (it is one group here;
    # JAX keeps the forward's values for it), none after the update. JAX's
    # gather inside `jit` moves equal blocks: each rank's padded to the
    # fullest's (one block here: one group, one dtype).
    torch = keras.backend.backend() == "torch"
    moved = whole if torch else hvd.size() * fullest
    assert gathered == (2 if torch else 1) * 3 * moved * 4, (gathered, whole, fullest)
    for k, (got, want) in enumerate(zip(weights(sharded), weights(plain))):
        differ = int(np.sum(got != want))
        assert differ == 0, f"weight {k}: {differ} entries differ from stage 0's"


def test_stage_three_reads_and_writes_whole_weights():
    """`get_weights`/`set_weights` see and take whole values on every rank
    (each keeps its rows), and evaluation reads the weights whole too."""
    model = _wide_fit(3, steps=1)
    values = model.get_weights()
    assert [v.shape for v in values] == [tuple(v.shape) for v in model.weights]
    for other in hvd.allgather_object([float(np.sum(v)) for v in values], name="sums"):
        assert other == [float(np.sum(v)) for v in values]
    new = [np.full(v.shape, 0.01 * (k + 1), "float32") for k, v in enumerate(values)]
    model.set_weights(new)
    for got, want in zip(model.get_weights(), new):
        np.testing.assert_array_equal(got, want)
    x = np.ones((4, 96), "float32")
    want = x
    for kernel, bias in zip(new[0::2], new[1::2]):
        want = want @ kernel + bias  # every value positive: relu changes nothing
    np.testing.assert_allclose(model.predict(x, verbose=0), want, rtol=1e-5)


@torch_only
def test_stage_three_under_torch_compile_equals_stage_zero():
    """`jit_compile=True` compiles Keras's torch step with `torch.compile`;
    stage 3's weight reads and gradient reduction run eagerly inside it
    (`torch.compiler.disable`) and the weights are eager stage 0's, within
    float rounding (the compiled update may fuse Adam's arithmetic). At 2
    ranks only: the compilation is most of its cost (about 15 s)."""
    if hvd.size() != 2:
        pytest.skip("runs at 2 ranks")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16 * hvd.size(), 6)).astype("float32")
    y = rng.normal(size=(16 * hvd.size(), 1)).astype("float32")
    mine = slice(16 * hvd.rank(), 16 * (hvd.rank() + 1))
    got = {}
    for stage, compiled in ((0, False), (3, True)):
        model = make_model(seed=1)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01),
                                                         zero_stage=stage),
                      loss="mse", jit_compile=compiled)
        model.fit(x[mine], y[mine], batch_size=8, epochs=2, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        got[stage] = weights(model)
    assert_close(got[3], got[0], "compiled stage 3 against eager stage 0")


@torch_only
@pytest.mark.parametrize("regather", [True, False], ids=["regather", "keep"])
def test_stage_three_frees_whole_weights_after_the_forward_pass(regather, monkeypatch):
    """By default nothing whole outlives the forward pass: the weights that
    operations saved for the backward pass are gathered again there
    (HVDKERAS_ZERO3_REGATHER=0 keeps them instead, at one gather a step)."""
    import torch

    monkeypatch.setenv("HVDKERAS_ZERO3_REGATHER", "1" if regather else "0")
    model = _wide_fit(3, steps=1)
    parameters = holder_of(model.optimizer)._hvdkeras_parameters
    x = torch.ones((4, 96))
    before = hvd.engine_stats()
    loss = torch.mean(model(x, training=True) ** 2)
    whole = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    if regather:  # every weight was gathered whole, and none is alive now
        assert len(parameters.live) == len(model.trainable_variables)
        assert [p for ref, p in parameters.live.values() if ref() is not None] == []
    loss.backward()
    gathered = (hvd.engine_stats() - before).bytes_gathered
    assert gathered == (2 if regather else 1) * whole * 4, (gathered, whole)
    model.optimizer.apply([v.value.grad for v in model.trainable_variables],
                          model.trainable_variables)
    assert not parameters.live and not parameters.packed and parameters.hooks is None


@torch_only
def test_stage_three_starts_the_next_gather_ahead_with_the_same_bits(monkeypatch):
    """With gather groups smaller than the model (HVDKERAS_ZERO3_GROUP_BYTES),
    each read of a group starts the next group's gather, forward and in the
    backward pass's regathers: from the second step on every read but each
    pass's first is answered by a gather started ahead. The same bytes move
    and the weights are stage 0's bit for bit, also when only rank 0 starts
    gathers ahead (a gather started ahead has the name of the one it
    replaces)."""
    monkeypatch.setenv("HVDKERAS_ZERO3_GROUP_BYTES", "100000")
    plain = _wide_fit(0)
    gathered, used = {}, {}
    for prefetch in ("on", "off", "rank 0 only"):
        monkeypatch.setenv("HVDKERAS_ZERO3_PREFETCH",
                           "1" if prefetch == "on" or (prefetch != "off" and hvd.rank() == 0)
                           else "0")
        before = hvd.engine_stats()
        model = _wide_fit(3)
        gathered[prefetch] = (hvd.engine_stats() - before).bytes_gathered
        parameters = holder_of(model.optimizer)._hvdkeras_parameters
        used[prefetch] = parameters.ahead.used
        assert not parameters.ahead.started, prefetch
        for k, (got, want) in enumerate(zip(weights(model), weights(plain))):
            differ = int(np.sum(got != want))
            assert differ == 0, f"{prefetch}: weight {k}: {differ} entries differ from stage 0's"
    assert parameters.state.groups == [[0], [1], [2], [3, 4, 5]]
    # 3 steps: the first learns the order; each later one reads the 4 groups
    # forward, then regathers the 2 whose kernels a matmul saved for its
    # input's gradient (the first layer's input needs none).
    assert used == {"on": 2 * (3 + 1), "off": 0,
                    "rank 0 only": 2 * (3 + 1) if hvd.rank() == 0 else 0}, used
    assert gathered["on"] == gathered["off"] == gathered["rank 0 only"], gathered

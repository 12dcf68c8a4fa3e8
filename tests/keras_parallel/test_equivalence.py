"""N ranks with batch B train exactly like one process with batch N*B.

Every test trains a small model on this rank's shard of the global batches
and compares the final weights (and optimizer state) with a plain Keras run,
in the same process, on the global batches: relative difference <= 1e-5.
Deterministic ops are on for the whole file.
"""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from keras_helpers import (assert_weights_close, assert_weights_moved, fit_distributed, mlp,
                           regression_data, run_reference, shard, variable_values)

tf.config.experimental.enable_op_determinism()

B = 4          # per-rank batch
STEPS = 5      # optimizer steps
SEED = 11

OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw_global_clipnorm": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1,
                                                            global_clipnorm=0.05),
}


def _compiled(optimizer) -> keras.Model:
    model = mlp(SEED)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _data(steps=STEPS):
    return regression_data(seed=5, rows=steps * hvd.size() * B)


@functools.lru_cache(maxsize=None)
def _reference(kind):
    """One process on the global batches (cached: several tests share it)."""
    x, y = _data()
    return run_reference(lambda: _compiled(OPTIMIZERS[kind]()), x, y,
                         batch_size=hvd.size() * B)


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_matches_one_process_on_the_global_batch(kind):
    x, y = _data()
    model = _compiled(hvd.DistributedOptimizer(OPTIMIZERS[kind]()))
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)

    reference = _reference(kind)
    assert_weights_moved(initial, reference.get_weights(), kind)
    assert_weights_close(model.get_weights(), reference.get_weights(), f"{kind} weights")
    assert_weights_close(variable_values(model.optimizer.variables),
                         variable_values(reference.optimizer.variables), f"{kind} optimizer state")
    assert int(model.optimizer.iterations.numpy()) == STEPS


def test_global_clipnorm_sees_the_averaged_gradient():
    """The clip in the AdamW case above is active: the global-batch gradient
    norm exceeds global_clipnorm, so clipping local gradients would differ."""
    x, y = _data()
    model = _compiled(OPTIMIZERS["adamw_global_clipnorm"]())
    with tf.GradientTape() as tape:
        loss = keras.losses.mean_squared_error(y[: hvd.size() * B],
                                               model(x[: hvd.size() * B]))
        loss = tf.reduce_mean(loss)
    norm = tf.linalg.global_norm(tape.gradient(loss, model.trainable_variables))
    assert float(norm) > 2 * model.optimizer.global_clipnorm


def _token_data(steps, per_rank, tokens):
    """Token ids where each id occurs once per global batch, and float targets.

    With one sample per embedding row the float16 gradient of each row is
    computed from one sample in both runs, so mixed precision introduces no
    rounding difference between N*B and B; the float32 Dense on top sums in
    float32. Rank 0's targets in step 1 are huge: its own scaled gradient
    overflows float16, the other rank's does not.
    """
    n = hvd.size()
    vocabulary = n * per_rank * tokens
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.permutation(vocabulary).reshape(n * per_rank, tokens)
                        for _ in range(steps)]).astype("int32")
    y = rng.normal(size=(steps * n * per_rank, 1)).astype("float32")
    y[:per_rank] *= 3000.0
    return vocabulary, x, y


def test_mixed_float16_matches_one_process_and_skips_overflow_together():
    steps, tokens = 4, 2
    vocabulary, x, y = _token_data(steps, B, tokens)

    def make(optimizer_fn):
        keras.config.set_dtype_policy("mixed_float16")
        try:
            keras.utils.set_random_seed(SEED)
            model = keras.Sequential([
                keras.Input((tokens,), dtype="int32"),
                keras.layers.Embedding(vocabulary, 4),
                keras.layers.Flatten(),
                keras.layers.Dense(1, use_bias=False, dtype="float32"),
            ])
            model.compile(optimizer=optimizer_fn(), loss="mse")
        finally:
            keras.config.set_dtype_policy("float32")
        return model

    model = make(lambda: hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert hvd.is_distributed(model.optimizer)
    assert not hvd.is_distributed(model.optimizer.inner_optimizer)
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, steps, B), shard(y, steps, B), batch_size=B)

    reference = make(lambda: keras.optimizers.Adam(0.01))
    reference.fit(x, y, batch_size=hvd.size() * B, shuffle=False, verbose=0)
    assert_weights_moved(initial, reference.get_weights(), "mixed_float16")
    assert_weights_close(model.get_weights(), reference.get_weights(), "mixed_float16 weights")
    # Step 1 overflowed (on rank 0 only, locally) and was skipped on every rank.
    assert int(reference.optimizer.iterations.numpy()) == steps - 1
    assert int(model.optimizer.iterations.numpy()) == steps - 1
    assert float(model.optimizer.dynamic_scale.numpy()) == float(
        reference.optimizer.dynamic_scale.numpy()) == 2.0 ** 14


VARIANTS = {
    "num_groups=2": dict(num_groups=2),
    "groups=first_layer": "first_layer",
    "gradient_predivide_factor=2": dict(gradient_predivide_factor=2.0),
    "sparse_as_dense+name": dict(sparse_as_dense=True, name="custom_name"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_grouping_and_scaling_options_keep_the_result(variant):
    x, y = _data()
    model = _compiled(OPTIMIZERS["sgd_momentum"]())
    options = VARIANTS[variant]
    if options == "first_layer":
        options = dict(groups=[model.layers[0].trainable_variables])
    model.optimizer = hvd.DistributedOptimizer(model.optimizer, **options)
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    assert_weights_close(model.get_weights(), _reference("sgd_momentum").get_weights(), variant)


def test_gradient_buckets_keep_the_result(monkeypatch):
    """Buckets (Note [gradient buckets]), forced on one host and made tiny so
    the MLP's gradients take several requests, give the one-process result."""
    from hvdkeras.training.gradient_reduction import bucket_groups

    monkeypatch.setenv("HVDKERAS_BACKWARD_OVERLAP", "1")
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "16")
    x, y = _data()
    model = _compiled(OPTIMIZERS["sgd_momentum"]())
    variables = model.trainable_variables
    planned = bucket_groups([v.value for v in variables], list(range(len(variables))))
    assert len(planned) > 1 and len(variables) - 1 in planned[0] and 0 in planned[-1]
    model.optimizer = hvd.DistributedOptimizer(model.optimizer)
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    assert_weights_close(model.get_weights(), _reference("sgd_momentum").get_weights(),
                         "gradient buckets")


def test_op_sum_equals_learning_rate_times_size():
    x, y = _data()
    model = _compiled(hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9),
                                               op=hvd.Sum))
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    reference = run_reference(
        lambda: _compiled(keras.optimizers.SGD(0.05 * hvd.size(), momentum=0.9)),
        x, y, batch_size=hvd.size() * B)
    assert_weights_close(model.get_weights(), reference.get_weights(), "op=Sum")


@pytest.mark.parametrize("average", [True, False], ids=["averaged", "summed"])
def test_backward_passes_per_step_two(average):
    """2 passes of batch B on N ranks, then one update == one process on the
    2 global batches together (averaged), or on their summed gradients
    (which for SGD is the same as doubling the learning rate)."""
    passes, updates = 2, 3
    x, y = _data(steps=passes * updates)
    model = _compiled(hvd.DistributedOptimizer(
        keras.optimizers.SGD(0.1, momentum=0.9), backward_passes_per_step=passes,
        average_aggregated_gradients=average))
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, passes * updates, B), shard(y, passes * updates, B),
                    batch_size=B)
    lr = 0.1 if average else 0.1 * passes
    reference = run_reference(lambda: _compiled(keras.optimizers.SGD(lr, momentum=0.9)),
                              x, y, batch_size=passes * hvd.size() * B)
    assert int(model.optimizer.iterations.numpy()) == updates
    assert int(reference.optimizer.iterations.numpy()) == updates
    assert_weights_moved(initial, reference.get_weights(), "backward passes")
    assert_weights_close(model.get_weights(), reference.get_weights(),
                         f"backward_passes_per_step=2 ({'averaged' if average else 'summed'})")


def test_gradient_tape_custom_loop_with_broadcast_model():
    x, y = _data()
    model = mlp(SEED + hvd.rank())            # different init on each rank
    optimizer = keras.optimizers.Adam(0.01)
    hvd.broadcast_model(model, optimizer=optimizer)
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function(autograph=False)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    xs, ys = shard(x, STEPS, B), shard(y, STEPS, B)
    for s in range(STEPS):
        step(xs[s * B:(s + 1) * B], ys[s * B:(s + 1) * B])

    reference = mlp(SEED)                     # rank 0's init
    reference_optimizer = keras.optimizers.Adam(0.01)
    glob = hvd.size() * B
    for s in range(STEPS):
        with tf.GradientTape() as tape:
            loss = loss_fn(y[s * glob:(s + 1) * glob], reference(x[s * glob:(s + 1) * glob]))
        reference_optimizer.apply(tape.gradient(loss, reference.trainable_variables),
                                  reference.trainable_variables)
    assert_weights_close(model.get_weights(), reference.get_weights(), "DistributedGradientTape")


EMBEDDING_CASES = {
    # SGD is linear in the gradient: repeated tokens within a batch are fine.
    "sgd_repeated_tokens": (lambda: keras.optimizers.SGD(0.5, momentum=0.9), True),
    # Keras 3's Adam squares IndexedSlices values before summing repeated
    # indices, so with repeats one process differs from any dense reduction;
    # here no token repeats within a global batch (and most rows are absent).
    "adam_distinct_tokens": (lambda: keras.optimizers.Adam(0.01), False),
    # With repeats, only the sparse path (gathered slices) can match one
    # process, so this case runs without sparse_as_dense only.
    "adam_repeated_tokens": (lambda: keras.optimizers.Adam(0.01), True),
}
EMBEDDING_PARAMS = [
    pytest.param(case, dense, id=f"{case}-{'dense' if dense else 'sparse'}")
    for case in EMBEDDING_CASES for dense in (False, True)
    if not (case == "adam_repeated_tokens" and dense)
]


@pytest.mark.parametrize("case, sparse_as_dense", EMBEDDING_PARAMS)
def test_embedding_gradients_match_one_process(case, sparse_as_dense):
    """Embedding gradients arrive as tf.IndexedSlices; both ways of reducing
    them give the single-process result."""
    make_optimizer, repeats = EMBEDDING_CASES[case]
    steps, tokens = 4, 3
    vocabulary = max(40, hvd.size() * B * tokens)  # room for distinct tokens at any size
    rows = steps * hvd.size() * B
    rng = np.random.default_rng(4)
    if repeats:
        x = rng.integers(0, 6, size=(rows, tokens))
    else:
        x = np.concatenate([rng.permutation(vocabulary)[: hvd.size() * B * tokens]
                            .reshape(hvd.size() * B, tokens) for _ in range(steps)])
    x = x.astype("int32")
    y = rng.normal(size=(rows, 1)).astype("float32")

    def make(optimizer):
        keras.utils.set_random_seed(SEED)
        model = keras.Sequential([keras.Input((tokens,), dtype="int32"),
                                  keras.layers.Embedding(vocabulary, 3),
                                  keras.layers.Flatten(), keras.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse")
        return model

    model = make(hvd.DistributedOptimizer(make_optimizer(), sparse_as_dense=sparse_as_dense))
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x[:B]))
    assert isinstance(tape.gradient(loss, model.layers[0].embeddings), tf.IndexedSlices)
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, steps, B), shard(y, steps, B), batch_size=B)
    reference = run_reference(lambda: make(make_optimizer()), x, y, batch_size=hvd.size() * B)
    assert_weights_moved(initial, reference.get_weights(), case)
    assert_weights_close(model.get_weights(), reference.get_weights(), case)


def test_steps_per_execution_matches_one_process():
    """Several steps per tf.function call run the collective in a loop."""
    x, y = _data()
    model = mlp(SEED)
    model.compile(optimizer=hvd.DistributedOptimizer(OPTIMIZERS["adam"]()), loss="mse",
                  steps_per_execution=2)
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    assert int(model.optimizer.iterations.numpy()) == STEPS
    assert_weights_close(model.get_weights(), _reference("adam").get_weights(),
                         "steps_per_execution=2")


class _SumRegularizer(keras.layers.Layer):
    """The guide's activity regularizer: a term that sums over the batch."""

    def __init__(self, ranks, **kwargs):
        super().__init__(**kwargs)
        self.ranks = ranks

    def call(self, inputs):
        self.add_loss(1e-2 * self.ranks * keras.ops.sum(keras.ops.square(inputs)))
        return inputs


def test_losses_that_sum_over_the_batch_need_the_rank_count():
    """docs/custom-loops.md's rule: a term summed over each rank's rows counts
    1/N once gradients are averaged; times hvd.size() it is one process's."""
    x, y = _data()

    def make(ranks, optimizer):
        keras.utils.set_random_seed(SEED)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                  _SumRegularizer(ranks), keras.layers.Dense(2)])
        model.compile(optimizer=optimizer, loss="mse")
        return model

    reference = run_reference(lambda: make(1, keras.optimizers.SGD(0.05)), x, y,
                              batch_size=hvd.size() * B)
    for ranks, matches in ((hvd.size(), True), (1, False)):
        model = make(ranks, hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)))
        fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
        if matches:
            assert_weights_close(model.get_weights(), reference.get_weights(), "sum x size")
        else:
            with pytest.raises(AssertionError):
                assert_weights_close(model.get_weights(), reference.get_weights(), "sum alone")

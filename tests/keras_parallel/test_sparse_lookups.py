"""Sparse (`tf.IndexedSlices`) gradients train as one process does at every
rank count, for every kind of lookup a model makes (Note [sparse gradients at
every rank count] in hvdkeras/collectives/sparse.py).

Keras 3's optimizers take sparse gradients slice by slice (Adam squares each
slice before it adds a row's repeats), so the ranks must hand the optimizer
the slices one process would make: one per occurrence for a lookup by the
batch's ids, one per row summed over the global batch for a table read the
same way for every example (a position table read with `arange`). Each model
below is trained on N ranks at batch B and in one process at batch N x B.
"""

import functools
import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.collectives.sparse import reduce_slices
from hvdkeras.engine import process_sets
from keras_helpers import (assert_weights_close, assert_weights_moved, fit_distributed,
                           run_reference, shard)

tf.config.experimental.enable_op_determinism()

B, STEPS, SEQ, VOCAB = 4, 5, 6, 12
SEED = 21


class TokensAndPositions(keras.layers.Layer):
    """The Keras transformer example's embedding: a token table read by the
    batch's ids plus a position table read with `arange` for every example."""

    def __init__(self, vocabulary, length, width, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(vocabulary, width)
        self.positions = keras.layers.Embedding(length, width)

    def call(self, ids):
        positions = keras.ops.arange(0, keras.ops.shape(ids)[-1], 1)
        return self.tokens(ids) + self.positions(positions)


class TwiceShared(keras.layers.Layer):
    """One table read twice: by the batch's ids, and (a second table) twice
    with `arange`, for the first half and the second half of the sequence."""

    def __init__(self, vocabulary, length, width, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(vocabulary, width)
        self.segments = keras.layers.Embedding(length, width)

    def call(self, ids):
        half = SEQ // 2
        first = self.tokens(ids[:, :half]) + self.segments(keras.ops.arange(0, half, 1))
        second = self.tokens(ids[:, half:]) + self.segments(keras.ops.arange(1, half + 1, 1))
        return keras.ops.concatenate([first, second], axis=1)


def _lookup(kind):
    if kind == "tokens_with_repeats":
        return keras.layers.Embedding(VOCAB, 3)
    if kind == "shared_by_the_batch":
        return TokensAndPositions(VOCAB, SEQ, 3)
    if kind == "several_lookups_of_one_table":
        return TwiceShared(VOCAB, SEQ, 3)
    assert kind == "mask_zero"
    return keras.layers.Embedding(VOCAB, 3, mask_zero=True)


KINDS = ["tokens_with_repeats", "shared_by_the_batch", "several_lookups_of_one_table",
         "mask_zero"]


def _model(kind, optimizer):
    keras.utils.set_random_seed(SEED)
    ids = keras.Input((SEQ,), dtype="int32")
    x = _lookup(kind)(ids)
    if kind == "mask_zero":
        x = keras.layers.GlobalAveragePooling1D()(x)  # takes the mask: padding ids drop out
    else:
        x = keras.layers.Flatten()(x)
    model = keras.Model(ids, keras.layers.Dense(2)(x))
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _data(steps=STEPS):
    rows = steps * hvd.size() * B
    rng = np.random.default_rng(5)
    x = rng.integers(0, 5, size=(rows, SEQ)).astype("int32")  # ids repeat often
    x[::3, -2:] = 0  # padding for mask_zero (an id like any other elsewhere)
    y = rng.normal(size=(rows, 2)).astype("float32")
    return x, y


def _sparse_gradients(model, x):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x[:B]))
    grads = tape.gradient(loss, model.trainable_variables)
    return [v.path for v, g in zip(model.trainable_variables, grads)
            if isinstance(g, tf.IndexedSlices)]


def _prebuilt(model):
    """The reference with its optimizer built before `fit`, as the broadcast
    callback builds the distributed one: ScheduleFreeAdamW copies the weights
    into its momentum when built, and built lazily inside Keras's first
    traced step it trains elsewhere (2.8 relative apart after 5 steps here,
    in one process without hvdkeras)."""
    model.optimizer.build(model.trainable_variables)
    return model


def _check(kind, make_optimizer, **options):
    x, y = _data()
    model = _model(kind, hvd.DistributedOptimizer(make_optimizer(), **options))
    assert _sparse_gradients(model, x), "the test needs tf.IndexedSlices gradients"
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    reference = run_reference(lambda: _prebuilt(_model(kind, make_optimizer())), x, y,
                              batch_size=hvd.size() * B)
    assert_weights_moved(initial, reference.get_weights(), kind)
    assert_weights_close(model.get_weights(), reference.get_weights(), kind)
    return model


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_of_lookup_trains_as_one_process_under_adam(kind):
    """Adam is the optimizer the issue was found with: a shared table's
    part-slices per rank changed its second moment."""
    _check(kind, lambda: keras.optimizers.Adam(0.05))


def test_a_shared_table_reaches_the_optimizer_as_one_process_makes_it():
    """The optimizer gets one slice per position, summed over every rank's
    rows, not one per rank (what gathering alone would give)."""
    x, _ = _data()
    model = _model("shared_by_the_batch", "sgd")
    table = model.layers[1].positions.embeddings
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(shard(x, 1, B)))
    local = tape.gradient(loss, table)
    assert isinstance(local, tf.IndexedSlices)
    reduced = reduce_slices([local], hvd.Average, 1.0, 1.0, lambda t: (t, None),
                            lambda t, _: t, "lookup_probe",
                            process_sets.view(hvd.global_process_set))[0]
    with tf.GradientTape() as tape:
        whole = tf.reduce_mean(model(x[: hvd.size() * B]))
    expected = tape.gradient(whole, table)
    np.testing.assert_array_equal(reduced.indices.numpy(), expected.indices.numpy())
    np.testing.assert_allclose(reduced.values.numpy(), expected.values.numpy(), rtol=1e-5,
                               atol=1e-7)


COMPOSITES = (keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)
BUILT_IN = sorted(name for name, cls in vars(keras.optimizers).items()
                  if inspect.isclass(cls) and issubclass(cls, keras.optimizers.Optimizer)
                  and cls is not keras.optimizers.Optimizer and cls not in COMPOSITES)


@functools.lru_cache(maxsize=None)
def _embedding_gradients(steps=3):
    """The transformer embedding model's initial weights and, for each of
    `steps` global batches, this rank's gradients (on its rows) and one
    process's (on all of them), tf.IndexedSlices for both tables."""
    x, y = _data(steps)
    model = _model("shared_by_the_batch", "sgd")
    loss_fn = keras.losses.MeanSquaredError()

    def gradients(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        return tape.gradient(loss, model.trainable_variables)

    mine_x, mine_y, glob = shard(x, steps, B), shard(y, steps, B), hvd.size() * B
    per_step = [(gradients(mine_x[s * B:(s + 1) * B], mine_y[s * B:(s + 1) * B]),
                 gradients(x[s * glob:(s + 1) * glob], y[s * glob:(s + 1) * glob]))
                for s in range(steps)]
    return [w.copy() for w in model.get_weights()], per_step


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_keras_optimizer_takes_the_transformer_embedding_as_one_process(name):
    """Each built-in optimizer, applied eagerly: this rank's gradients through
    the distributed optimizer end where one process's global-batch gradients
    end (fit's path is the Adam tests' above)."""
    initial, per_step = _embedding_gradients()
    assert any(isinstance(g, tf.IndexedSlices) for g in per_step[0][0])
    distributed_vars = [keras.Variable(w) for w in initial]
    reference_vars = [keras.Variable(w) for w in initial]
    make = getattr(keras.optimizers, name)
    distributed = hvd.DistributedOptimizer(make(learning_rate=0.05),
                                           name=f"every_optimizer_{name}")
    reference = make(learning_rate=0.05)
    for mine, everyone in per_step:
        distributed.apply(mine, distributed_vars)
        reference.apply(everyone, reference_vars)
    want = [v.numpy() for v in reference_vars]
    assert_weights_moved(initial, want, name)
    assert_weights_close([v.numpy() for v in distributed_vars], want, name)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_train_shared_and_per_row_lookups_as_one_process(stage):
    _check("several_lookups_of_one_table", lambda: keras.optimizers.Adam(0.05),
           zero_stage=stage)


def test_compressed_sparse_gradients_still_add_a_shared_table():
    """fp16 on the wire: the shared table's rows are added after the values
    come back, so the result is one process's to fp16's precision."""
    x, y = _data()
    model = _model("shared_by_the_batch",
                   hvd.DistributedOptimizer(keras.optimizers.Adam(0.05),
                                            compression=hvd.Compression.fp16))
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)
    reference = run_reference(lambda: _model("shared_by_the_batch", keras.optimizers.Adam(0.05)),
                              x, y, batch_size=hvd.size() * B)
    assert_weights_close(model.get_weights(), reference.get_weights(), "fp16", rtol=5e-3)

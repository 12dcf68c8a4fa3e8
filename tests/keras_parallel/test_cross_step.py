"""Cross-step updates (Note [cross-step updates] in hvdkeras/training/cross_step.py)
give the synchronous step's results bit for bit, and every configuration
that cannot have them keeps today's step.

Each test trains the same model on the same shards twice in this process,
with HVDKERAS_CROSS_STEP_OVERLAP=0 and =1, and compares weights, optimizer
variables and iteration counts exactly. Deterministic ops are on for the file.
"""

import contextlib
import os
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from keras_helpers import assert_weights_moved, regression_data, shard, variable_values

tf.config.experimental.enable_op_determinism()

B = 4          # per-rank batch
STEPS = 10     # steps per epoch
EPOCHS = 2     # 20 steps in all
KNOB = "HVDKERAS_CROSS_STEP_OVERLAP"


@contextlib.contextmanager
def _knob(value: str, bucket_bytes: str = "300"):
    """The knob (and small buckets, so the model has several) for one run."""
    saved = {k: os.environ.get(k) for k in (KNOB, "HVDKERAS_BUCKET_BYTES")}
    os.environ[KNOB] = value
    os.environ["HVDKERAS_BUCKET_BYTES"] = bucket_bytes
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _model(seed: int = 7) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(16, activation="tanh"),
        keras.layers.Dense(8, activation="tanh",
                           kernel_constraint=keras.constraints.MaxNorm(2.0)),
        keras.layers.Dense(2),
    ])


def _data():
    x, y = regression_data(seed=5, rows=STEPS * hvd.size() * B)
    return shard(x, STEPS, B), shard(y, STEPS, B)


class _Observed(keras.callbacks.Callback):
    """Reads the weights and the iteration count after every batch, as a
    user's callback may: they must be the synchronous step's."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_end(self, batch, logs=None):
        self.seen.append([w.copy() for w in self.model.get_weights()]
                         + [np.array(int(self.model.optimizer.iterations.numpy()))])


def _train(knob: str, make_optimizer, callbacks=(), observe=False, **dist_kwargs):
    """Trains under `knob`; returns (model, optimizer, observations, outstanding
    buckets at the end of fit before anything read the weights)."""
    with _knob(knob):
        model = _model()
        optimizer = hvd.DistributedOptimizer(make_optimizer(), **dist_kwargs)
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        x, y = _data()
        observed = _Observed()
        extra = [observed] if observe else []
        model.fit(x, y, batch_size=B, epochs=EPOCHS, shuffle=False, verbose=0,
                  validation_data=(x[:B], y[:B]),
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
                  + list(callbacks) + extra)
        pending = getattr(optimizer, "_hvdkeras_cross_step", None)
        outstanding = None if pending is None else int(pending.outstanding.numpy())
        return model, optimizer, observed.seen, outstanding


def _state(model, optimizer):
    return (variable_values(model.trainable_variables) + variable_values(optimizer.variables)
            + [np.array(int(optimizer.iterations.numpy()))])


def _assert_identical(actual, expected, what):
    assert len(actual) == len(expected), what
    for k, (a, e) in enumerate(zip(actual, expected)):
        assert np.array_equal(a, e), (
            f"{what}: tensor {k} differs by {np.max(np.abs(np.asarray(a, np.float64) - e)):.3g} "
            f"on rank {hvd.rank()}")


OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),
    "rmsprop_centered": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "adadelta": lambda: keras.optimizers.Adadelta(1.0),
    "adamax": lambda: keras.optimizers.Adamax(0.01),
    "ftrl": lambda: keras.optimizers.Ftrl(0.1, l1_regularization_strength=0.01),
    "lion": lambda: keras.optimizers.Lion(0.001),
    "adam_clipnorm_schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.02, 3, 0.5), clipnorm=0.1),
}


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_same_weights_bit_for_bit(kind):
    """Weights, slots and iterations after fit (with validation and a callback
    reading the weights after every batch) equal the synchronous step's."""
    sync_model, sync_opt, sync_seen, _ = _train("0", OPTIMIZERS[kind], observe=True)
    model, opt, seen, outstanding = _train("1", OPTIMIZERS[kind], observe=True)
    assert getattr(sync_opt, "_hvdkeras_cross_step", None) is None
    assert len(opt._hvdkeras_cross_step.buckets) >= 2, "the test model should fill several buckets"
    # fit finished the last step's reductions before it returned (the
    # observing callback and the validation pass had read them already).
    assert outstanding == 0
    _assert_identical(_state(model, opt), _state(sync_model, sync_opt), f"{kind}: final state")
    assert len(seen) == len(sync_seen) == STEPS * EPOCHS
    for step, (a, e) in enumerate(zip(seen, sync_seen)):
        _assert_identical(a, e, f"{kind}: what a callback saw after batch {step}")
    assert_weights_moved(variable_values(_model().trainable_variables),
                         variable_values(model.trainable_variables), kind)


def _traced_step(model, optimizer):
    """A custom loop's traced step: mse on `model`, applied by `optimizer`;
    returns the loss."""

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
        optimizer.apply(tape.gradient(loss, model.trainable_variables),
                        model.trainable_variables)
        return loss

    return step


def test_fit_finishes_its_updates_and_a_custom_step_leaves_them_pending():
    """fit returns with nothing pending (a rank that exits right after must
    not shut the engine down under another rank's last step); a custom
    loop's traced step returns with its buckets pending, and the first eager
    read finishes them all. Both give the synchronous weights."""
    with _knob("1"):
        model = _model()
        optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
        model.compile(optimizer=optimizer, loss="mse", jit_compile=False)
        x, y = _data()
        model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        pending = optimizer._hvdkeras_cross_step
        assert int(pending.outstanding.numpy()) == 0
        weights = model.get_weights()
        _traced_step(model, optimizer)(x[:B], y[:B])
        assert int(pending.outstanding.numpy()) == len(pending.buckets)
        after_step = model.get_weights()
        assert int(pending.outstanding.numpy()) == 0
    with _knob("0"):
        sync = _model()
        sync_optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
        sync.compile(optimizer=sync_optimizer, loss="mse", jit_compile=False)
        sync.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0,
                 callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        sync_weights = sync.get_weights()
        _traced_step(sync, sync_optimizer)(x[:B], y[:B])
    _assert_identical(weights, sync_weights, "weights read after fit")
    _assert_identical(after_step, sync.get_weights(), "weights read after a custom step")


def test_evaluate_predict_and_save_see_the_updates():
    """evaluate, predict and a saved file after fit (pending updates left)
    give what the synchronous run gives."""
    results = {}
    for knob in ("0", "1"):
        with _knob(knob):
            model = _model()
            model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, 0.9)),
                          loss="mse", jit_compile=False)
            x, y = _data()
            model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0,
                      callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
            loss = model.evaluate(x, y, batch_size=B, verbose=0)
            predicted = model.predict(x, batch_size=B, verbose=0)
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, f"m{hvd.rank()}.weights.h5")
                model.save_weights(path)
                fresh = _model()
                fresh.load_weights(path)
            results[knob] = [np.array(loss), predicted] + fresh.get_weights()
    _assert_identical(results["1"], results["0"], "evaluate, predict, saved weights")


def test_custom_loop_with_a_traced_step():
    """A custom loop whose tf.function applies the gradients (optimizer built
    first) gives the synchronous loop's weights."""
    finals = {}
    for knob in ("0", "1"):
        with _knob(knob):
            model = _model()
            optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))
            optimizer.build(model.trainable_variables)
            x, y = _data()
            step = _traced_step(model, optimizer)

            losses = [float(step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B]))
                      for s in range(STEPS)]
            assert (getattr(optimizer, "_hvdkeras_cross_step", None) is not None) == (knob == "1")
            finals[knob] = [np.array(losses)] + model.get_weights()
    _assert_identical(finals["1"], finals["0"], "custom loop")


@pytest.mark.parametrize("kind", ["sgd_momentum", "adam", "adamw"])
def test_mixed_bfloat16(kind):
    """mixed_bfloat16 (no loss scaling) takes cross-step updates, exactly."""
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        sync_model, sync_opt, _, _ = _train("0", OPTIMIZERS[kind])
        model, opt, _, _ = _train("1", OPTIMIZERS[kind])
    finally:
        keras.config.set_dtype_policy("float32")
    assert getattr(opt, "_hvdkeras_cross_step", None) is not None
    _assert_identical(_state(model, opt), _state(sync_model, sync_opt),
                      f"{kind} under mixed_bfloat16")


FALLBACKS = {
    "global_clipnorm": (lambda: keras.optimizers.Adam(0.01, global_clipnorm=0.05), {}),
    "keras_accumulation": (lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), {}),
    "backward_passes": (lambda: keras.optimizers.SGD(0.1), {"backward_passes_per_step": 2}),
    "ema": (lambda: keras.optimizers.Adam(0.01, use_ema=True, ema_momentum=0.9), {}),
    "zero_1": (lambda: keras.optimizers.Adam(0.01), {"zero_stage": 1}),
    "zero_2": (lambda: keras.optimizers.Adam(0.01), {"zero_stage": 2}),
    "zero_3": (lambda: keras.optimizers.Adam(0.01), {"zero_stage": 3}),
    "nadam": (lambda: keras.optimizers.Nadam(0.01), {}),
    "explicit_groups": (lambda: keras.optimizers.SGD(0.1), {"num_groups": 2}),
}


@pytest.mark.parametrize("kind", sorted(FALLBACKS))
def test_fallbacks_keep_todays_step(kind):
    """Configurations whose update needs every gradient (or a different
    reduction) keep the synchronous step with the knob on: same results."""
    make, kwargs = FALLBACKS[kind]
    sync_model, sync_opt, _, _ = _train("0", make, **kwargs)
    model, opt, _, _ = _train("1", make, **kwargs)
    assert getattr(opt, "_hvdkeras_cross_step", None) is None
    assert getattr(getattr(opt, "inner_optimizer", opt), "_hvdkeras_cross_step", None) is None
    _assert_identical(variable_values(model.trainable_variables),
                      variable_values(sync_model.trainable_variables), kind)


def test_mixed_float16_keeps_todays_step():
    """mixed_float16 wraps the optimizer in a LossScaleOptimizer, whose
    overflow check needs every gradient: today's step, the same weights."""
    keras.config.set_dtype_policy("mixed_float16")
    sync_model, _, _, _ = _train("0", lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    model, opt, _, _ = _train("1", lambda: keras.optimizers.SGD(0.1, momentum=0.9))
    assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
    assert getattr(opt, "_hvdkeras_cross_step", None) is None
    _assert_identical(variable_values(model.trainable_variables),
                      variable_values(sync_model.trainable_variables), "mixed_float16")


def test_xla_step_keeps_todays_step():
    """A step compiled with XLA cannot wait for pending reductions: it keeps
    the synchronous step, and nothing is ever left pending."""
    finals = {}
    for knob in ("0", "1"):
        with _knob(knob):
            model = _model()
            optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
            optimizer.build(model.trainable_variables)
            x, y = _data()

            @tf.function(jit_compile=True)
            def step(xb, yb):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
                optimizer.apply(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables)
                return loss

            for s in range(STEPS):
                step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B])
            pending = getattr(optimizer, "_hvdkeras_cross_step", None)
            assert (pending is not None) == (knob == "1")
            if pending is not None:
                assert not pending.started
            finals[knob] = model.get_weights()
    _assert_identical(finals["1"], finals["0"], "XLA step")


def _started_in_priority_order(priorities):
    """Starts one pending allreduce per priority, in the given order, then
    waits for all; returns each result (rank r contributes (r + 1) * (i + 1))."""
    from hvdkeras.collectives import kernels
    from hvdkeras.engine.types import Sum
    rank = hvd.rank()

    @tf.function(autograph=False)
    def run():
        handles = [kernels.allreduce_start([tf.fill([3000], float((rank + 1) * (i + 1)))], Sum,
                                           1.0, 1.0, f"priority_test_{i}", 0, priority=p)
                   for i, p in enumerate(priorities)]
        return [kernels.allreduce_done(h, tf.float32, [tf.TensorShape([3000])])[0]
                for h in handles]

    return [r.numpy() for r in run()]


def test_prioritised_reductions_are_exact():
    """Held and reordered on the wire (Note [priority on the wire] in
    ops/core/wire_order.h), each reduction still sums each rank's own tensor."""
    total = sum(r + 1 for r in range(hvd.size()))
    results = _started_in_priority_order([9, 0, 7, 1, 1, 3])
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result, np.full([3000], float(total * (i + 1)), np.float32))


def test_mismatched_priorities_fail_on_every_rank_naming_them():
    """A priority is part of what every rank must agree on."""
    with pytest.raises(tf.errors.OpError, match=r"Mismatched priorities.*priority 1.*priority 2"):
        _started_in_priority_order([hvd.rank() + 1])

"""Sharded optimizer state (zero_stage 1 and 2): every built-in Keras 3
optimizer, and the options that span variables or steps, give the weights
of stage 0 and of one process applying the rank-averaged gradient.

Runs at 2 ranks (tests/test_keras_mpi.py) and at 4 (tests/test_zero.py)."""

import functools
import inspect
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd

COMPOSITES = (keras.optimizers.LossScaleOptimizer, keras.optimizers.MultiOptimizer)
BUILT_IN = sorted(name for name, cls in vars(keras.optimizers).items()
                  if inspect.isclass(cls) and issubclass(cls, keras.optimizers.Optimizer)
                  and cls is not keras.optimizers.Optimizer and cls not in COMPOSITES)
# Matrices, vectors and a 3-D tensor (Adafactor factors its last two axes,
# Muon treats 2-D variables apart), enough for every rank to own some.
SHAPES = [(4, 3), (3,), (5, 4), (2, 2, 3), (8,), (6, 2), (3, 3), (7,)]
STAGES = [1, 2]


class Boosted(keras.optimizers.SGD):
    """A user subclass that overrides update_step."""

    def update_step(self, gradient, variable, learning_rate):
        super().update_step(3.0 * gradient, variable, learning_rate)


def _make(kind, **options):
    if kind == "user_subclass":
        return Boosted(0.1, momentum=0.5, **options)
    if kind == "LossScaleOptimizer":
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.1, **options),
                                                   initial_scale=8.0)
    return getattr(keras.optimizers, kind)(learning_rate=0.1, **options)


def _variables(shapes=SHAPES):
    return [keras.Variable(np.full(s, k + 1.0, "float32")) for k, s in enumerate(shapes)]


def _gradients(steps, shapes=SHAPES, seed=0):
    """Per step, one gradient per rank for each variable."""
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=(hvd.size(),) + s).astype("float32") for s in shapes]
            for _ in range(steps)]


def _run(optimizer, variables, grads, mean=False, apply=None):
    apply = apply or optimizer.apply
    for step in grads:
        values = [g.mean(axis=0) if mean else g[hvd.rank()] for g in step]
        apply([tf.constant(v) for v in values], variables)
    return [v.numpy() for v in variables]


def _assert_close(got, want, what):
    for k, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, err_msg=f"{what}: variable {k}")


def _slot_bytes(optimizer):
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    return sum(int(np.prod(v.shape)) * 4 for v in inner.variables if len(v.shape) > 0)


MATCH_STEPS = 3


@functools.cache
def _references(kind):
    """(stage 0's weights, one process's weights, stage 0's slot bytes) for `kind`.

    Both stages compare against the same references, so each is computed once
    (every rank runs the tests in the same order, so every rank takes part in
    the same stage-0 collectives)."""
    grads = _gradients(MATCH_STEPS)
    unsharded = hvd.DistributedOptimizer(_make(kind), name=f"z0{kind}")
    want0 = _run(unsharded, _variables(), grads)
    want1 = _run(_make(kind), _variables(), grads, mean=True)
    return want0, want1, _slot_bytes(unsharded)


# Beyond 2 ranks (tests/test_zero.py's 4-rank run), the optimizers whose
# update of a variable reads the whole variable (a factored or matrix
# update, a trust ratio), Adam for the elementwise rest, and the two
# wrappers. An elementwise optimizer's update of an element depends on that
# element's gradients alone, so which rank owns it cannot change the result:
# what more ranks change for those is the layout, which Adam's case checks.
# HVDKERAS_ZERO_FOUR_RANKS_EVERYTHING=1 runs every optimizer at every size.
WHOLE_VARIABLE_KINDS = ("Adafactor", "Adam", "Lamb", "Muon", "LossScaleOptimizer",
                        "user_subclass")


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kind", BUILT_IN + ["LossScaleOptimizer", "user_subclass"])
def test_matches_stage_0_and_one_process(kind, stage):
    if (hvd.size() > 2 and kind not in WHOLE_VARIABLE_KINDS
            and os.environ.get("HVDKERAS_ZERO_FOUR_RANKS_EVERYTHING") != "1"):
        pytest.skip(f"{kind} is elementwise: beyond 2 ranks Adam's case covers its layout")
    want0, want1, unsharded_slot_bytes = _references(kind)
    grads = _gradients(MATCH_STEPS)
    sharded = hvd.DistributedOptimizer(_make(kind), zero_stage=stage, name=f"z{stage}{kind}")
    got = _run(sharded, _variables(), grads)
    assert max(np.max(np.abs(w - (k + 1.0))) for k, w in enumerate(want1)) > 1e-4
    _assert_close(got, want0, f"{kind} stage {stage} vs stage 0")
    _assert_close(got, want1, f"{kind} stage {stage} vs one process")
    if hvd.size() > 1 and kind not in ("SGD", "user_subclass"):  # plain SGD keeps no slots
        assert _slot_bytes(sharded) < 0.75 * unsharded_slot_bytes, kind


OPTIONS = {
    "global_clipnorm": ("Adam", {"global_clipnorm": 0.5}),
    "clipnorm": ("Adam", {"clipnorm": 0.3}),
    "clipvalue": ("RMSprop", {"clipvalue": 0.2}),
    "weight_decay": ("AdamW", {"weight_decay": 0.1}),
    "ema": ("Adam", {"use_ema": True, "ema_momentum": 0.5, "ema_overwrite_frequency": 2}),
    "gradient_accumulation": ("Adam", {"gradient_accumulation_steps": 2}),
    "lamb_clipnorm": ("Lamb", {"global_clipnorm": 0.5}),
    "muon_decay": ("Muon", {"weight_decay": 0.1}),
}


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_options_that_span_variables_or_steps(option, stage):
    kind, options = OPTIONS[option]
    grads = _gradients(4, seed=1)
    got_vars = _variables()
    sharded = hvd.DistributedOptimizer(_make(kind, **options), zero_stage=stage,
                                       name=f"o{stage}{option}")
    got = _run(sharded, got_vars, grads)
    reference = _make(kind, **options)
    want_vars = _variables()
    want = _run(reference, want_vars, grads, mean=True)
    if options.get("use_ema"):
        sharded.finalize_variable_values(got_vars)
        reference.finalize_variable_values(want_vars)
        got, want = [v.numpy() for v in got_vars], [v.numpy() for v in want_vars]
    _assert_close(got, want, f"{option} stage {stage}")


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_inside_a_tf_function(stage, jit):
    grads = _gradients(3, seed=2)
    sharded = hvd.DistributedOptimizer(_make("Adam", global_clipnorm=1.0), zero_stage=stage,
                                       name=f"f{stage}{jit}")
    variables = _variables()
    sharded.build(variables)
    step = tf.function(lambda g: sharded.apply(g, variables), jit_compile=jit)
    got = _run(sharded, variables, grads, apply=lambda g, _: step(g))
    want = _run(_make("Adam", global_clipnorm=1.0), _variables(), grads, mean=True)
    _assert_close(got, want, f"tf.function(jit_compile={jit}) stage {stage}")


@pytest.mark.parametrize("stage", STAGES)
def test_loss_scaling_skips_the_same_steps_on_every_rank(stage):
    grads = _gradients(4, seed=3)
    grads[1][2][hvd.size() - 1, 0, 0] = np.inf  # the last rank overflows in step 2
    sharded = hvd.DistributedOptimizer(_make("LossScaleOptimizer"), zero_stage=stage,
                                       name=f"ls{stage}")
    got = _run(sharded, _variables(), grads)
    reference = _make("LossScaleOptimizer")
    want = _run(reference, _variables(), grads, mean=True)
    _assert_close(got, want, f"loss scaling stage {stage}")
    assert float(sharded.dynamic_scale.numpy()) == float(reference.dynamic_scale.numpy()) == 4.0


@pytest.mark.parametrize("stage", STAGES)
def test_sparse_gradients(stage):
    rng = np.random.default_rng(4)
    table = [keras.Variable(np.ones((10, 3), "float32")), keras.Variable(np.ones(3, "float32"))]
    reference_table = [keras.Variable(np.ones((10, 3), "float32")),
                       keras.Variable(np.ones(3, "float32"))]
    sharded = hvd.DistributedOptimizer(_make("Adam"), zero_stage=stage, name=f"sp{stage}")
    reference = _make("Adam")
    for _ in range(3):
        rows = rng.integers(0, 10, size=(hvd.size(), 4))
        values = rng.normal(size=(hvd.size(), 4, 3)).astype("float32")
        dense = rng.normal(size=(hvd.size(), 3)).astype("float32")
        mine = tf.IndexedSlices(tf.constant(values[hvd.rank()]), tf.constant(rows[hvd.rank()]),
                                tf.constant([10, 3]))
        sharded.apply([mine, tf.constant(dense[hvd.rank()])], table)
        everyone = tf.IndexedSlices(tf.constant(values.reshape(-1, 3) / hvd.size()),
                                    tf.constant(rows.reshape(-1)), tf.constant([10, 3]))
        reference.apply([everyone, tf.constant(dense.mean(axis=0))], reference_table)
    _assert_close([v.numpy() for v in table], [v.numpy() for v in reference_table],
                  f"sparse stage {stage}")


@pytest.mark.parametrize("stage", STAGES)
def test_backward_passes_per_step(stage):
    grads = _gradients(4, seed=5)
    sharded = hvd.DistributedOptimizer(_make("Adam"), zero_stage=stage,
                                       backward_passes_per_step=2,
                                       average_aggregated_gradients=True, name=f"bp{stage}")
    got = _run(sharded, _variables(), grads)
    merged = [[(a + b) / 2 for a, b in zip(grads[i], grads[i + 1])] for i in (0, 2)]
    want = _run(_make("Adam"), _variables(), merged, mean=True)
    _assert_close(got, want, f"backward_passes_per_step stage {stage}")


@pytest.mark.parametrize("stage", STAGES)
def test_local_variables_stay_local(stage):
    grads = _gradients(3, seed=6)
    variables = _variables()
    sharded = hvd.DistributedOptimizer(_make("Adam"), zero_stage=stage, name=f"lv{stage}",
                                       scale_local_gradients=False)
    sharded.register_local_var(variables[0])
    got = _run(sharded, variables, grads)
    want = _run(_make("Adam"), _variables(), grads, mean=True)
    _assert_close(got[1:], want[1:], f"shared variables stage {stage}")
    alone = _run(_make("Adam"), _variables(SHAPES[:1]), [[s[0]] for s in grads])
    _assert_close(got[:1], alone, f"local variable stage {stage}")


@pytest.mark.parametrize("stage", STAGES)
def test_a_rank_that_owns_nothing(stage):
    """One variable: the other ranks own none, yet run the shared parts
    (Nadam's running product, the global norm) in step."""
    shapes = [(4, 3)]
    grads = _gradients(3, shapes, seed=7)
    sharded = hvd.DistributedOptimizer(_make("Nadam", global_clipnorm=0.5), zero_stage=stage,
                                       name=f"none{stage}")
    got = _run(sharded, _variables(shapes), grads)
    want = _run(_make("Nadam", global_clipnorm=0.5), _variables(shapes), grads, mean=True)
    _assert_close(got, want, f"one variable stage {stage}")
    assert int(sharded.iterations.numpy()) == 3


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3"):
        hvd.DistributedOptimizer(_make("Adam"), zero_stage=4)
    with pytest.raises(ValueError, match="Adasum"):
        hvd.DistributedOptimizer(_make("Adam"), zero_stage=1, op=hvd.Adasum)
    adam, sgd = keras.optimizers.Adam(0.1), keras.optimizers.SGD(0.1)
    multi = keras.optimizers.MultiOptimizer(lambda v: adam if len(v.shape) == 2 else sgd)
    with pytest.raises(ValueError, match="MultiOptimizer"):
        hvd.DistributedOptimizer(multi, zero_stage=2)
    built = _make("Adam")
    built.build(_variables())
    with pytest.raises(ValueError, match="is built"):
        hvd.DistributedOptimizer(built, zero_stage=1)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("grouping", ["num_groups", "groups"])
def test_gradient_groups(stage, grouping):
    """Gradients reduced in several groups (what lets reduction overlap the
    backward pass) give the same result."""
    grads = _gradients(3, seed=8)
    variables = _variables()
    options = ({"num_groups": 3} if grouping == "num_groups"
               else {"groups": [variables[:2], variables[4:6]]})
    sharded = hvd.DistributedOptimizer(_make("Adam"), zero_stage=stage, name=f"g{stage}{grouping}",
                                       **options)
    got = _run(sharded, variables, grads)
    want = _run(_make("Adam"), _variables(), grads, mean=True)
    _assert_close(got, want, f"{grouping} stage {stage}")

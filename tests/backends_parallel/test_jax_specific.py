"""What only the JAX binding does: collectives inside `jax.jit` (the FFI
custom call), gradients through `jax.custom_vjp`, shapes fixed at compile
time. Exact per rank."""

import keras
import numpy as np
import pytest

import hvdkeras as hvd

if keras.backend.backend() != "jax":
    pytest.skip("JAX backend only", allow_module_level=True)

import jax  # noqa: E402  (after the skip: absent under the other backends)
import jax.numpy as jnp  # noqa: E402


def test_alltoall_uneven_splits_eagerly():
    n, r = hvd.size(), hvd.rank()
    splits = [k + 1 for k in range(n)]  # k+1 rows to rank k
    rows = jnp.concatenate([jnp.full((k + 1, 2), 100 * r + k, jnp.int32) for k in range(n)])
    got, received = hvd.alltoall(rows, splits=splits)
    assert received.tolist() == [r + 1] * n
    assert got.dtype == jnp.int32
    assert got[:, 0].tolist() == [100 * k + r for k in range(n) for _ in range(r + 1)]
    even, counts = hvd.alltoall(jnp.arange(2.0 * n) + 100 * r, name="alltoall.even")
    assert counts.tolist() == [2] * n
    assert even.tolist() == [100.0 * k + 2 * r + i for k in range(n) for i in (0, 1)]


def test_alltoall_inside_jit_sends_equal_parts_exactly():
    n, r = hvd.size(), hvd.rank()

    @jax.jit
    def step(x):
        return hvd.alltoall(x), hvd.alltoall(x * 10, splits=[2] * n, name="alltoall.given")

    # Rank r sends rows [2k, 2k+2) to rank k: values 100 r + (row index).
    rows = jnp.arange(2.0 * n) + 100 * r
    (got, counts), (scaled, scaled_counts) = step(rows)
    expected = [100.0 * k + 2 * r + i for k in range(n) for i in (0, 1)]
    assert np.asarray(got).tolist() == expected
    assert np.asarray(scaled).tolist() == [10 * v for v in expected]
    assert np.asarray(counts).tolist() == np.asarray(scaled_counts).tolist() == [2] * n
    assert got.dtype == jnp.float32 or got.dtype == jnp.float64
    # The compiled step runs again under the same names.
    assert np.asarray(step(rows)[0][0]).tolist() == expected


def test_alltoall_gradient_inside_jit_goes_back_the_same_way():
    n, r = hvd.size(), hvd.rank()

    def loss(x):
        received, _ = hvd.alltoall(x)
        # Weight each received row by (this rank + 1) * (its position + 1).
        return (received * (r + 1) * (jnp.arange(received.shape[0]) + 1.0)).sum()

    g = jax.jit(jax.grad(loss))(jnp.ones(2 * n))
    # My rows [2k, 2k+2) became rows [2r, 2r+2) of rank k's output.
    assert np.asarray(g).tolist() == [float((k + 1) * (2 * r + i + 1))
                                      for k in range(n) for i in (0, 1)]


def test_alltoall_inside_jit_refuses_what_jit_cannot_shape():
    n = hvd.size()
    with pytest.raises(ValueError, match="split evenly"):
        jax.jit(lambda x: hvd.alltoall(x)[0])(jnp.zeros(2 * n + 1))
    if n > 1:
        uneven = [2] + [1] * (n - 1)
        with pytest.raises(ValueError, match="equal parts"):
            jax.jit(lambda x: hvd.alltoall(x, splits=uneven)[0])(jnp.zeros(n + 1))
    with pytest.raises(ValueError, match="known when the step compiles"):
        jax.jit(lambda x, s: hvd.alltoall(x, splits=s)[0])(jnp.zeros(n), jnp.ones(n, jnp.int32))


def test_collectives_inside_jit():
    n, r = hvd.size(), hvd.rank()

    @jax.jit
    def step(x):
        total = hvd.allreduce(x * 2, op=hvd.Sum)
        mean = hvd.allreduce(x + 1)
        gathered = hvd.allgather(x)
        mine = hvd.reducescatter(jnp.tile(x[:1], (n + 1,)), op=hvd.Sum)
        root = hvd.broadcast(x, root_rank=n - 1)
        return total, mean, gathered, mine, root

    total, mean, gathered, mine, root = step(jnp.full((2,), float(r)))
    s = float(sum(range(n)))
    assert np.asarray(total).tolist() == [2 * s] * 2
    assert np.asarray(mean).tolist() == [s / n + 1] * 2
    assert np.asarray(gathered).tolist() == [float(k) for k in range(n) for _ in range(2)]
    rows = (n + 1) // n + (1 if r < (n + 1) % n else 0)
    assert np.asarray(mine).tolist() == [s] * rows
    assert np.asarray(root).tolist() == [float(n - 1)] * 2
    # Run again: the compiled step reuses its names, one step after another.
    assert np.asarray(step(jnp.full((2,), float(r)))[0]).tolist() == [2 * s] * 2


def test_grouped_allgather_and_reducescatter_inside_jit():
    n, r = hvd.size(), hvd.rank()

    @jax.jit
    def step(x):
        gathered = hvd.grouped_allgather([x, x.astype(jnp.int32)])
        mine = hvd.grouped_reducescatter([jnp.tile(x[:1], (n,)), x], op=hvd.Sum)
        return gathered, mine

    (g_float, g_int), (m_tiled, m_x) = step(jnp.full((2,), float(r)))
    everyone = [float(k) for k in range(n) for _ in range(2)]
    assert np.asarray(g_float).tolist() == everyone
    assert np.asarray(g_int).tolist() == [int(v) for v in everyone]
    s = float(sum(range(n)))
    assert np.asarray(m_tiled).tolist() == [s]
    assert np.asarray(m_x).tolist() == [s] * (2 // n + (1 if r < 2 % n else 0))


def test_gradients_through_custom_vjp_eagerly_and_jitted():
    n, r = hvd.size(), hvd.rank()
    total = sum(k + 1 for k in range(n))

    def loss(y):
        return (hvd.allreduce(y * (r + 1), op=hvd.Sum) * (r + 1)).sum()

    for grad in (jax.grad(loss), jax.jit(jax.grad(loss))):
        assert np.asarray(grad(jnp.array([1.0, 2.0]))).tolist() == [total * (r + 1)] * 2

    def through_broadcast(y):
        return (hvd.broadcast(y, root_rank=0) * (r + 1)).sum()

    g = jax.jit(jax.grad(through_broadcast))(jnp.array([3.0]))
    assert np.asarray(g).tolist() == ([float(total)] if r == 0 else [0.0])

    def through_allgather(y):
        gathered = hvd.allgather(y)
        return (gathered * jnp.arange(gathered.shape[0], dtype=gathered.dtype)).sum()

    g = jax.jit(jax.grad(through_allgather))(jnp.ones(2))
    assert np.asarray(g).tolist() == [float(n * (2 * r + i)) for i in range(2)]

    def through_reducescatter(y):
        return (hvd.reducescatter(y, op=hvd.Sum) * (r + 1)).sum()

    g = jax.jit(jax.grad(through_reducescatter))(jnp.ones((n + 1,)))
    owners = [k for k in range(n) for _ in range((n + 1) // n + (1 if k < (n + 1) % n else 0))]
    assert np.asarray(g).tolist() == [float(k + 1) for k in owners]


def test_uneven_rows_inside_jit_fail_on_every_rank_with_the_reason():
    r = hvd.rank()
    with pytest.raises(Exception, match="same rows"):
        jax.jit(lambda x: hvd.allgather(x))(jnp.ones((1 + r % 2, 2)) if hvd.size() > 1
                                             else jnp.ones((3, 2))[:0].reshape(-1, 5))
    hvd.barrier()


def test_a_shape_only_some_ranks_planned_leaves_no_rank_waiting():
    # Rank r passes (r + 1) rows per part: every rank receives the same total,
    # which is the planned shape on the middle rank of an odd size only. The
    # ranks whose output does not fit fail with the reason, the others finish
    # (Note [a failed output allocation still takes part] in
    # ops/core/collectives.h): before, a rank that fitted waited in MPI for
    # the others until the stall bound ended the job.
    n, r = hvd.size(), hvd.rank()
    total = n * (n + 1) // 2
    fits = (r + 1) * n == total
    rows = jnp.arange(float((r + 1) * n)) + 100 * r
    calls = {"allgather": lambda x: hvd.allgather(x, name="mismatch.gather"),
             "alltoall": lambda x: hvd.alltoall(x, name="mismatch.alltoall")[0]}
    for what, call in calls.items():
        if fits:
            got = np.asarray(jax.jit(call)(rows)).tolist()
            if what == "allgather":
                assert got == [100.0 * k + i for k in range(n) for i in range((k + 1) * n)]
            else:
                assert got == [100.0 * k + (k + 1) * r + i for k in range(n)
                               for i in range(k + 1)]
        else:
            with pytest.raises(Exception, match="same rows"):
                jax.block_until_ready(jax.jit(call)(rows))
        hvd.barrier()


def _stage_fit(stage, eager):
    """A two-layer model and its first layer as a model of its own, trained
    with validation; every rank starts from rank 0's weights."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(16 * hvd.size(), 12)).astype("float32")
    y = rng.normal(size=(16 * hvd.size(), 3)).astype("float32")
    keras.utils.set_random_seed(5)
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-2),
                                                     zero_stage=stage),
                  loss="mse", run_eagerly=eager)
    mine = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    model.fit(*mine, batch_size=4, epochs=2, verbose=0, shuffle=False, validation_data=mine,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return model, keras.Model(inputs, hidden)


@pytest.mark.parametrize("eager", [False, True], ids=["jit", "run_eagerly"])
def test_stage_three_steps_carry_rows_and_equal_stage_zero(eager):
    """Under `jit` (and run eagerly) a stage-3 step's state holds each
    rank's rows only, in all a copy of the weights across the ranks; the
    weights, an evaluation and a model made of some of the layers give
    stage 0's values."""
    plain, plain_encoder = _stage_fit(0, eager)
    sharded, encoder = _stage_fit(3, eager)
    rows = [np.asarray(v) for v in sharded._get_jax_state(trainable_variables=True)[0]]
    everyone = hvd.allgather_object([r.size for r in rows], name="state_sizes")
    for k, v in enumerate(sharded.trainable_variables):
        assert sum(sizes[k] for sizes in everyone) == int(np.prod(v.shape)), v.path
        assert rows[k].shape[1:] == tuple(v.shape)[1:] or rows[k].size == 0, v.path
    exact = np.testing.assert_allclose if eager else np.testing.assert_array_equal
    for got, want in zip(sharded.get_weights(), plain.get_weights()):
        exact(got, want, **({"rtol": 1e-6} if eager else {}))
    probe = np.linspace(-1, 1, 24, dtype="float32").reshape(2, 12)
    np.testing.assert_allclose(encoder.predict(probe, verbose=0),
                               plain_encoder.predict(probe, verbose=0), rtol=1e-6)
    target = np.ones((2, 3), "float32")
    assert sharded.evaluate(probe, target, verbose=0) == pytest.approx(
        plain.evaluate(probe, target, verbose=0), rel=1e-6)


class GuideModel(keras.Model):
    """Keras's guide to customising `fit` under JAX: its own
    `compute_loss_and_updates`, differentiated in its own `train_step`."""

    def compute_loss_and_updates(self, trainable_variables, non_trainable_variables, x, y,
                                 training=False):
        y_pred, non_trainable_variables = self.stateless_call(
            trainable_variables, non_trainable_variables, x, training=training)
        return keras.ops.mean(keras.ops.square(y - y_pred)), (y_pred, non_trainable_variables)

    def train_step(self, state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y = data
        (loss, (_, non_trainable)), grads = jax.value_and_grad(
            self.compute_loss_and_updates, has_aux=True)(
                trainable, non_trainable, x, y, training=True)
        trainable, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable)
        return {"loss": loss}, (trainable, non_trainable, optimizer_variables, metrics_variables)

    def test_step(self, state, data):
        trainable, non_trainable, metrics_variables = state
        loss, (_, non_trainable) = self.compute_loss_and_updates(
            trainable, non_trainable, *data)
        return {"loss": loss}, (trainable, non_trainable, metrics_variables)


class ClosureModel(keras.Model):
    """A `train_step` that differentiates a closure over `stateless_call`,
    and a `test_step` that calls it directly."""

    def train_step(self, state, data):
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y = data

        def loss_of(values):
            y_pred, updated = self.stateless_call(values, non_trainable, x, training=True)
            return keras.ops.mean(keras.ops.square(y - y_pred)), updated

        (loss, non_trainable), grads = jax.value_and_grad(loss_of, has_aux=True)(trainable)
        trainable, optimizer_variables = self.optimizer.stateless_apply(
            optimizer_variables, grads, trainable)
        return {"loss": loss}, (trainable, non_trainable, optimizer_variables, metrics_variables)

    def test_step(self, state, data):
        trainable, non_trainable, metrics_variables = state
        x, y = data
        y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x)
        return ({"loss": keras.ops.mean(keras.ops.square(y - y_pred))},
                (trainable, non_trainable, metrics_variables))


@pytest.mark.parametrize("model_class", [GuideModel, ClosureModel], ids=["guide", "closure"])
def test_stage_three_runs_custom_steps_on_whole_weights(model_class):
    """A model with its own `train_step` and `test_step` (the two ways
    Keras's JAX guide writes them) trains, evaluates and predicts at stage 3
    as at stage 0, bit for bit, while its step's state holds rows."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(8 * hvd.size(), 12)).astype("float32")
    y = rng.normal(size=(8 * hvd.size(), 3)).astype("float32")
    mine = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    probe = np.linspace(-1, 1, 24, dtype="float32").reshape(2, 12)
    results = []
    for stage in (0, 3):
        keras.utils.set_random_seed(5)
        inputs = keras.Input((12,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        model = model_class(inputs, keras.layers.Dense(3)(hidden))
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(1e-2),
                                                         zero_stage=stage))
        model.fit(*mine, batch_size=4, epochs=2, verbose=0, shuffle=False,
                  callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
        rows = [np.asarray(v) for v in model._get_jax_state(trainable_variables=True)[0]]
        results.append((model.get_weights(), model.evaluate(*mine, verbose=0),
                        model.predict(probe, verbose=0), [r.size for r in rows]))
    (plain, plain_loss, plain_out, _), (sharded, loss, out, sizes) = results
    assert sum(sizes) < sum(int(np.prod(w.shape)) for w in sharded) or hvd.size() == 1
    for got, want in zip(sharded, plain):
        np.testing.assert_array_equal(got, want)
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    np.testing.assert_allclose(out, plain_out, rtol=1e-6)

"""`model.fit` under KERAS_BACKEND=torch or jax on N ranks equals one process
training on the same global batches (each rank holds its slice of every
global batch), with the user's script unchanged from TensorFlow's.
"""

import keras
import numpy as np
import pytest

import hvdkeras as hvd

GLOBAL_BATCH = 12
STEPS = 4


def data(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(GLOBAL_BATCH * STEPS, 6)).astype("float32")
    y = (x @ rng.normal(size=(6, 1)) + 0.1).astype("float32")
    return x, y


def my_slice(n, r):
    per = GLOBAL_BATCH // n
    return np.concatenate([np.arange(b * GLOBAL_BATCH + r * per,
                                     b * GLOBAL_BATCH + (r + 1) * per) for b in range(STEPS)])


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(1)])


def weights(model):
    return [keras.ops.convert_to_numpy(v) for v in model.weights]


def reference(optimizer, epochs=2):
    """One process, the global batch, the plain optimizer."""
    x, y = data()
    model = make_model(seed=7)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, shuffle=False, verbose=0)
    return model


def distributed(optimizer, epochs=2, callbacks=(), **settings):
    n, r = hvd.size(), hvd.rank()
    if GLOBAL_BATCH % n:
        pytest.skip(f"{GLOBAL_BATCH} does not split over {n} ranks")
    x, y = data()
    mine = my_slice(n, r)
    model = make_model(seed=7 + 1000 * r)  # ranks start apart: the broadcast must fix it
    model.compile(optimizer=hvd.DistributedOptimizer(optimizer, **settings), loss="mse")
    history = model.fit(x[mine], y[mine], batch_size=GLOBAL_BATCH // n, epochs=epochs,
                        shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), *callbacks])
    return model, history


@pytest.mark.parametrize("make_optimizer", [
    lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    lambda: keras.optimizers.Adam(0.01),
    lambda: keras.optimizers.AdamW(0.01, weight_decay=0.01, global_clipnorm=0.5),
], ids=["sgd", "adam", "adamw_clip"])
def test_fit_equals_one_process_on_the_global_batch(make_optimizer):
    model, _ = distributed(make_optimizer())
    expected = reference(make_optimizer())
    for got, want in zip(weights(model), weights(expected)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    for got, want in zip(model.optimizer.variables, expected.optimizer.variables):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got),
                                   keras.ops.convert_to_numpy(want), rtol=2e-5, atol=2e-6)


def test_loss_scale_optimizer_inside_equals_one_process():
    """A LossScaleOptimizer wrapped by DistributedOptimizer: under JAX Keras calls
    its `stateless_apply`, which never reaches `apply`; the gradients must still
    be averaged, so every rank ends where one process on the global batch does."""
    def make():
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))

    model, _ = distributed(make())
    expected = reference(make())
    for got, want in zip(weights(model), weights(expected)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    for got, want in zip(model.optimizer.variables, expected.optimizer.variables):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got),
                                   keras.ops.convert_to_numpy(want), rtol=2e-5, atol=2e-6)


def test_gradient_groups_and_predivision_change_nothing():
    model, _ = distributed(keras.optimizers.Adam(0.01), num_groups=2,
                           gradient_predivide_factor=2.0)
    expected = reference(keras.optimizers.Adam(0.01))
    for got, want in zip(weights(model), weights(expected)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_every_rank_ends_with_the_same_weights_and_averaged_metrics():
    model, history = distributed(keras.optimizers.Adam(0.01),
                                 callbacks=[hvd.callbacks.MetricAverageCallback()])
    mine = np.concatenate([w.ravel() for w in weights(model)])
    everyone = keras.ops.convert_to_numpy(hvd.allgather(keras.ops.convert_to_tensor(mine[None])))
    assert np.array_equal(everyone.min(0), everyone.max(0))
    losses = keras.ops.convert_to_numpy(hvd.allgather(
        keras.ops.convert_to_tensor([history.history["loss"][-1]])))
    assert np.all(losses == losses[0])


@pytest.mark.parametrize("average", [True, False], ids=["mean_of_passes", "sum_of_passes"])
def test_backward_passes_per_step_equals_one_process_accumulating(average):
    """Two passes per update, reduced once on the update pass, equal one process
    using Keras's own accumulation on the same global batches. Horovod's default
    applies the sum of the passes: for SGD with momentum that is the mean with
    twice the learning rate."""
    model, _ = distributed(keras.optimizers.SGD(0.05, momentum=0.9), backward_passes_per_step=2,
                           average_aggregated_gradients=average)
    expected = reference(keras.optimizers.SGD(0.05 if average else 0.1, momentum=0.9,
                                              gradient_accumulation_steps=2))
    for got, want in zip(weights(model), weights(expected)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    for got, want in zip(model.optimizer.variables, expected.optimizer.variables):
        if "learning_rate" not in got.path:  # the reference's is doubled for the sum
            np.testing.assert_allclose(keras.ops.convert_to_numpy(got),
                                       keras.ops.convert_to_numpy(want), rtol=2e-5, atol=2e-6)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == STEPS  # 2 epochs / 2


def test_backward_passes_with_adam_and_clipping_equal_one_process():
    model, _ = distributed(keras.optimizers.Adam(0.01, global_clipnorm=0.5),
                           backward_passes_per_step=2, average_aggregated_gradients=True)
    expected = reference(keras.optimizers.Adam(0.01, global_clipnorm=0.5,
                                               gradient_accumulation_steps=2))
    for got, want in zip(weights(model), weights(expected)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_backward_passes_move_bytes_on_update_passes_only():
    """4 passes per update over 8 batches: two reductions, not eight."""
    before = hvd.engine_stats()
    distributed(keras.optimizers.SGD(0.05), epochs=2, backward_passes_per_step=4)
    reduced = (hvd.engine_stats() - before).bytes_reduced
    per_update = 4 * (6 * 8 + 8 + 8 * 1 + 1)  # the model's float32 gradients
    assert reduced == 2 * per_update, reduced


def test_backward_passes_settings_are_checked():
    with pytest.raises(ValueError, match="already accumulates"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=2),
                                 backward_passes_per_step=2)
    built = keras.optimizers.SGD()
    built.build([keras.Variable(np.zeros(2, "float32"))])
    with pytest.raises(ValueError, match="not built yet"):
        hvd.DistributedOptimizer(built, backward_passes_per_step=2)
    with pytest.raises(ValueError, match="LossScaleOptimizer"):
        hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()),
                                 backward_passes_per_step=2)
    with pytest.raises(ValueError, match=">= 1"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)


def test_adasum_trains_inside_the_backends_step():
    """op=Adasum inside Keras's compiled step: the ranks' gradients are combined
    there, so every rank ends with the same weights, and training progresses."""
    model, history = distributed(keras.optimizers.SGD(0.05), op=hvd.Adasum)
    mine = np.concatenate([w.ravel() for w in weights(model)])
    everyone = keras.ops.convert_to_numpy(hvd.allgather(keras.ops.convert_to_tensor(mine[None])))
    assert np.array_equal(everyone.min(0), everyone.max(0))
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_distributing_twice_is_refused():
    with pytest.raises(ValueError, match="already distributed"):
        hvd.DistributedOptimizer(hvd.DistributedOptimizer(keras.optimizers.Adam()))

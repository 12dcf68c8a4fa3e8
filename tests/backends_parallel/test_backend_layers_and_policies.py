"""Under KERAS_BACKEND=torch or jax: Keras's dtype policies and
`hvd.SyncBatchNormalization` train on N ranks as one process does on the
global batch.

* `DistributedOptimizer(optimizer)` under "mixed_float16" holds the loss
  scaling inside itself, as under TensorFlow, so `compile()` keeps it and
  the overflow check sees the averaged gradients on every rank.
* `SyncBatchNormalization` normalises over the global batch and its moving
  statistics are the same on every rank: one process's `BatchNormalization`
  on the global batch.
"""

import keras
import numpy as np
import pytest

import hvdkeras as hvd

PER_RANK, STEPS = 6, 4

# Compute in float16 or bfloat16 rounds the per-rank batch's sums
# differently from the global batch's; float32 is exact to roundoff.
TOLERANCE = {"float32": 2e-5, "mixed_float16": 3e-3, "mixed_bfloat16": 3e-2}


def _data(seed=1, features=5):
    rows = STEPS * hvd.size() * PER_RANK
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = (x @ rng.normal(size=(features, 1))).astype("float32")
    return x, y


def _mine(array):
    """This rank's rows of each global batch (rank r holds rows r*B..(r+1)*B-1)."""
    n, r, b = hvd.size(), hvd.rank(), PER_RANK
    return np.concatenate([array[s * n * b + r * b: s * n * b + (r + 1) * b]
                           for s in range(STEPS)])


def _numpy(values):
    return [keras.ops.convert_to_numpy(v).astype("float32") for v in values]


def _fit(model, x, y, batch_size, callbacks=()):
    model.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0, callbacks=list(callbacks))
    return model


def _policy_model(policy, optimizer):
    keras.config.set_dtype_policy(policy)
    try:
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                                  keras.layers.Dense(1, dtype="float32")])
        model.compile(optimizer=optimizer() if callable(optimizer) else optimizer, loss="mse")
    finally:
        keras.config.set_dtype_policy("float32")
    return model


@pytest.mark.parametrize("policy", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_fit_under_each_dtype_policy_equals_one_process(policy):
    x, y = _data()
    # A mean loss's per-example gradients at batch B are N times those at
    # batch N x B, so a loss scale near float16's limit could overflow on the
    # ranks and not in one process. The targets keep every batch far from it,
    # except rank 0's first, which overflows at any batch size.
    y *= 0.01
    if policy == "mixed_float16":
        y[:PER_RANK] *= 1e6

    def distributed_optimizer():
        # The policy is set when DistributedOptimizer runs, as the docs ask.
        return hvd.DistributedOptimizer(keras.optimizers.Adam(0.01))

    model = _policy_model(policy, distributed_optimizer)
    if policy == "mixed_float16":
        assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        assert hvd.is_distributed(model.optimizer)
    _fit(model, _mine(x), _mine(y), PER_RANK,
         [hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    reference = _fit(_policy_model(policy, lambda: keras.optimizers.Adam(0.01)), x, y,
                     hvd.size() * PER_RANK)
    for got, want in zip(_numpy(model.weights), _numpy(reference.weights)):
        np.testing.assert_allclose(got, want, rtol=TOLERANCE[policy],
                                   atol=TOLERANCE[policy] / 10)
    if policy == "mixed_float16":
        # The first step overflowed in one process, so every rank skipped it.
        assert int(keras.ops.convert_to_numpy(reference.optimizer.iterations)) == STEPS - 1
        assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == STEPS - 1
        everyone = hvd.allgather_object(float(keras.ops.convert_to_numpy(
            model.optimizer.dynamic_scale)), name="dynamic_scale")
        assert len(set(everyone)) == 1


def test_mixed_float16_with_accumulated_passes_is_refused_clearly():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        with pytest.raises(ValueError, match="mixed_float16.*backward_passes_per_step|"
                                             "backward_passes_per_step.*mixed_float16"):
            hvd.DistributedOptimizer(keras.optimizers.Adam(0.01), backward_passes_per_step=2)
    finally:
        keras.config.set_dtype_policy("float32")


def _batch_norm_model(layer):
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(6), layer,
                             keras.layers.Dense(1)])


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_sync_batch_norm_equals_one_process_batch_norm_on_the_global_batch(momentum):
    x, y = _data(seed=4, features=4)
    x += np.arange(4, dtype="float32")  # means far from 0: local statistics would differ
    model = _batch_norm_model(hvd.SyncBatchNormalization(momentum=momentum))
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    _fit(model, _mine(x), _mine(y), PER_RANK, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

    reference = _batch_norm_model(keras.layers.BatchNormalization(momentum=momentum))
    reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    _fit(reference, x, y, hvd.size() * PER_RANK)
    for got, want, variable in zip(_numpy(model.weights), _numpy(reference.weights),
                                   reference.weights):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=variable.path)
    moving = [v for v in model.weights if "moving" in v.path]
    assert len(moving) == 2
    everyone = hvd.allgather_object(_numpy(moving), name="moving_statistics")
    for other in everyone:
        for a, b in zip(other, everyone[0]):
            np.testing.assert_array_equal(a, b)
    # Inference uses the moving statistics, as the plain layer does.
    np.testing.assert_allclose(keras.ops.convert_to_numpy(model.predict(x[:5], verbose=0)),
                               keras.ops.convert_to_numpy(reference.predict(x[:5], verbose=0)),
                               rtol=2e-5, atol=2e-6)

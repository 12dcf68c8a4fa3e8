"""SyncBatchNormalization on 2 ranks equals plain BatchNormalization in one
process on the global batch: the normalized outputs (even batches, uneven
ones, masked rows), the moving statistics, and a whole training run with
DistributedOptimizer (relative difference <= 1e-5).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from keras_helpers import (assert_weights_close, assert_weights_moved, fit_distributed,
                           regression_data, run_reference, shard)

tf.config.experimental.enable_op_determinism()

B, STEPS, SEED = 4, 5, 3


def _global_rows(rows_of_rank, features=5, seed=7):
    """Every rank's rows (rank r has rows_of_rank(r)), the same on every rank."""
    rng = np.random.default_rng(seed)
    parts = [rng.normal(loc=2.0, scale=3.0, size=(rows_of_rank(r), features)).astype("float32")
             for r in range(hvd.size())]
    return parts, np.concatenate(parts)


@pytest.mark.parametrize("rows_of_rank", [lambda r: 4, lambda r: 2 + 3 * r],
                         ids=["even", "uneven"])
def test_training_outputs_and_moving_statistics_are_the_global_batchs(rows_of_rank):
    parts, whole = _global_rows(rows_of_rank)
    sync = hvd.SyncBatchNormalization(momentum=0.5)
    plain = keras.layers.BatchNormalization(momentum=0.5)
    mine = sync(parts[hvd.rank()], training=True).numpy()
    reference = plain(whole, training=True).numpy()
    start = sum(rows_of_rank(r) for r in range(hvd.rank()))
    np.testing.assert_allclose(mine, reference[start:start + len(mine)], rtol=1e-5, atol=1e-5)
    assert_weights_close([sync.moving_mean.numpy(), sync.moving_variance.numpy()],
                         [plain.moving_mean.numpy(), plain.moving_variance.numpy()],
                         "moving statistics")


def test_masked_rows_count_as_the_plain_layer_counts_them():
    rng = np.random.default_rng(4)
    whole = rng.normal(size=(2 * hvd.size(), 3, 4)).astype("float32")
    mask = rng.random((2 * hvd.size(), 3)) > 0.3
    mine = slice(2 * hvd.rank(), 2 * hvd.rank() + 2)
    sync = hvd.SyncBatchNormalization(momentum=0.0)
    plain = keras.layers.BatchNormalization(momentum=0.0)
    sync(whole[mine], training=True, mask=mask[mine])
    plain(whole, training=True, mask=mask)
    assert_weights_close([sync.moving_mean.numpy(), sync.moving_variance.numpy()],
                         [plain.moving_mean.numpy(), plain.moving_variance.numpy()],
                         "masked statistics", rtol=1e-4)


def _model(norm):
    keras.utils.set_random_seed(SEED)
    # No bias before the normalization: it would only learn float noise (its
    # gradient is zero up to rounding), which no relative comparison can judge.
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, use_bias=False), norm(),
                             keras.layers.Activation("tanh"), keras.layers.Dense(2)])


def test_training_matches_one_process_on_the_global_batch():
    x, y = regression_data(seed=9, rows=STEPS * hvd.size() * B)
    model = _model(hvd.SyncBatchNormalization)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    initial = [w.copy() for w in model.get_weights()]
    fit_distributed(model, shard(x, STEPS, B), shard(y, STEPS, B), batch_size=B)

    def reference_model():
        model = _model(keras.layers.BatchNormalization)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model

    reference = run_reference(reference_model, x, y, batch_size=hvd.size() * B)
    assert_weights_moved(initial, reference.get_weights(), "sync batch norm")
    # Weights, biases, gamma, beta and the moving mean and variance.
    assert_weights_close(model.get_weights(), reference.get_weights(), "sync batch norm")


def test_inference_is_the_plain_layer_and_bad_arguments_are_refused():
    sync = hvd.SyncBatchNormalization()
    x = np.arange(12, dtype="float32").reshape(4, 3) + hvd.rank()
    np.testing.assert_allclose(sync(x, training=False).numpy(),
                               keras.layers.BatchNormalization()(x, training=False).numpy())
    for argument in ("renorm", "synchronized"):
        with pytest.raises(ValueError, match=f"does not take {argument}=True"):
            hvd.SyncBatchNormalization(**{argument: True})

"""Gradient compression: values really travel in the narrow dtype, and
training reaches the same accuracy as uncompressed training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.training.gradient_reduction import ReductionSettings, reduce_gradients

COMPRESSIONS = {"none": hvd.Compression.none, "fp16": hvd.Compression.fp16,
                "bf16": hvd.Compression.bf16}


# What survives a round trip through each wire dtype (and the average of
# identical values) of 1 + 2**-10 + 2**-20.
WIRE_RESULT = {"none": 1 + 2 ** -10 + 2 ** -20, "fp16": 1 + 2 ** -10, "bf16": 1.0}


@pytest.mark.parametrize("kind", list(WIRE_RESULT))
def test_values_travel_in_the_wire_dtype(kind):
    # Each rank sends 1 + 2**-10 + 2**-20: float32 keeps it all, float16 keeps
    # 2**-10 but drops 2**-20, bfloat16 (7-bit mantissa) drops both.
    value = tf.constant([1 + 2 ** -10 + 2 ** -20], tf.float32)
    settings = ReductionSettings(compression=COMPRESSIONS[kind], name=f"t_wire_{kind}")
    (reduced,) = reduce_gradients([value], settings)
    assert reduced.dtype == tf.float32
    assert float(reduced[0]) == WIRE_RESULT[kind]


def _classification(seed, rows):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8)).astype("float32")
    w = np.linspace(-1, 1, 8).astype("float32")
    y = (x @ w + 0.1 * rng.normal(size=rows) > 0).astype("int32")
    return x, y


def _train(compression):
    keras.utils.set_random_seed(12)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5),
                                                     compression=compression),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    x, y = _classification(seed=50 + hvd.rank(), rows=256)
    model.fit(x, y, batch_size=32, epochs=4, verbose=0, shuffle=False,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    x_test, y_test = _classification(seed=99, rows=512)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    return accuracy, model.get_weights()


def test_compressed_training_reaches_the_same_accuracy():
    baseline, base_weights = _train(hvd.Compression.none)
    assert baseline > 0.9, f"the baseline did not learn ({baseline:.3f}): vacuous comparison"
    for kind in ("fp16", "bf16"):
        accuracy, weights = _train(COMPRESSIONS[kind])
        assert abs(accuracy - baseline) <= 0.03, (kind, accuracy, baseline)
        differs = any(not np.array_equal(a, b) for a, b in zip(weights, base_weights))
        assert differs, f"{kind}: weights identical to uncompressed: nothing was compressed"

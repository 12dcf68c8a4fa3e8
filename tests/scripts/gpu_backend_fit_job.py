"""One `fit` step of a small model on the GPU under KERAS_BACKEND (torch or
jax) with `DistributedOptimizer` at one rank (scripts/gpu_check.sh): the
gradients are CUDA tensors, reduced through the engine's GPU path. Prints
the loss against the same step without hvdkeras.

    KERAS_BACKEND=torch python tests/scripts/gpu_backend_fit_job.py
"""
import keras
import numpy as np

import hvdkeras as hvd


def one_step(distributed: bool) -> float:
    keras.utils.set_random_seed(7)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(4)])
    optimizer = keras.optimizers.Adam(1e-2)
    if distributed:
        optimizer = hvd.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16)).astype("float32")
    y = rng.normal(size=(64, 4)).astype("float32")
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    return float(model.evaluate(x, y, verbose=0))


hvd.init()
print(f"{keras.backend.backend()}: pinned {hvd.pin_gpu()}")
plain, wrapped = one_step(False), one_step(True)
print(f"loss after 2 steps: plain {plain:.6f}, DistributedOptimizer {wrapped:.6f}")
hvd.shutdown()
assert abs(plain - wrapped) <= 1e-5 * max(1.0, abs(plain)), (plain, wrapped)

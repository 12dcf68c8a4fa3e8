"""Runs GPUStatsCallback through model.fit on every rank and writes what the
epoch logs held to <out>/rank<r>.json.

Modes: "stand-in" replaces the callback's NVML reader with made-up readings
(rank r reads utilization 10*(r+1) and then 30*(r+1), memory 100*(r+1) MiB
and then 50): a stand-in for NVML, which cannot run without a GPU, so that
the gathering and the log names are checked against exact values.
"no-driver" uses the real reader on a machine without an NVIDIA driver and
also fits without the callback, to compare the logs' keys.
"""

import json
import sys
from pathlib import Path

import keras
import numpy as np

import hvdkeras as hvd

mode, out = sys.argv[1], Path(sys.argv[2])
hvd.init()
hvd.pin_gpu()  # no GPU here: does nothing
rank = hvd.rank()


def model_and_data():
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss="mse")
    x = np.random.default_rng(rank).normal(size=(32, 4)).astype("float32")
    return model, x, x.sum(axis=1, keepdims=True)


class StandInReadings:
    """Made-up readings in place of NVML (see the module docstring)."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        scale = 10.0 if self.calls % 2 else 30.0
        return {"utilization": scale * (rank + 1),
                "memory_used_mb": 100.0 * (rank + 1) if self.calls == 1 else 50.0,
                "power_w": None, "temperature_c": 40.0 + rank}


callback = hvd.callbacks.GPUStatsCallback(interval_seconds=3600)
if mode == "stand-in":
    callback._read = StandInReadings()
model, x, y = model_and_data()
history = model.fit(x, y, epochs=2, batch_size=8, verbose=0, callbacks=[callback])
result = {"logs": {k: v for k, v in history.history.items()}}
if mode == "no-driver":
    model, x, y = model_and_data()
    result["without"] = sorted(model.fit(x, y, epochs=2, batch_size=8, verbose=0).history)
(out / f"rank{rank}.json").write_text(json.dumps(result))
hvd.shutdown()

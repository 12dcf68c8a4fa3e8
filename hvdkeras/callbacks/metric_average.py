"""Epoch metrics averaged over ranks, so decisions taken from them agree."""

from __future__ import annotations

import zlib
from typing import Dict, List

import keras
import numpy as np

from hvdkeras.callbacks._prepare import prepare_model
from hvdkeras.engine import world
from hvdkeras.engine.types import Average, Max
from hvdkeras.host.arrays import allreduce


def _numeric_keys(logs: Dict) -> List[str]:
    return sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.isreal(v))


class MetricAverageCallback(keras.callbacks.Callback):
    """Replaces each epoch-end metric with its average over all ranks.

    Callbacks that decide from metrics (`EarlyStopping`, `ReduceLROnPlateau`,
    best-checkpoint selection) must decide the same on every rank, or one
    rank stops while the others wait in the next collective. Put this
    callback before them: Keras passes one logs dict to the callbacks in list
    order, and the average is written into it in place (History records the
    averaged values too). All metrics travel in one collective.

    The average is exact for metrics that are means over equal-sized shards
    (loss, accuracy with equal batches); ratio metrics (precision, AUC) and
    uneven shards are approximated by the mean of the per-rank values.

    Example:

    ```python
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(),
                 keras.callbacks.ReduceLROnPlateau(patience=2)]
    ```

    Args:
        device: Accepted for Horovod scripts and not used: hvdkeras places
            its collectives itself.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__()
        self.device = device

    def set_model(self, model) -> None:
        super().set_model(model)
        prepare_model(model)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if logs is None or world.size() == 1:
            return
        keys = _numeric_keys(logs)
        self._check_same_keys(keys)
        if not keys:
            return
        values = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        averaged = allreduce(values, op=Average, name="hvdkeras_metric_average")
        for key, value in zip(keys, averaged):
            logs[key] = float(value)

    @staticmethod
    def _check_same_keys(keys: List[str]) -> None:
        digest = zlib.crc32("\0".join(keys).encode()) + 1
        spread = allreduce(np.array([digest, -digest], dtype=np.int64), op=Max,
                           name="hvdkeras_metric_keys")
        if spread[0] != -spread[1]:
            raise ValueError(
                "MetricAverageCallback: the ranks logged different metrics at epoch end "
                f"(this rank, {world.rank()}: {keys}). Every rank must compile the same metrics "
                "and run the same validation, or the averages would mix different quantities."
            )

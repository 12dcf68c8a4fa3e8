"""The callbacks of a recipe run, in the order hvdkeras needs them, and the
small callbacks only recipes use (learning-rate logging, stopping at a step,
throughput).

What may import this module: `hvdkeras.recipes.training` (it imports Keras).
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional, Tuple

import keras

from hvdkeras.callbacks.broadcast_global_variables import BroadcastGlobalVariablesCallback
from hvdkeras.callbacks.checkpoint import CheckpointCallback
from hvdkeras.callbacks.engine_stats import EngineStatsCallback
from hvdkeras.callbacks.gpu_stats import GPUStatsCallback
from hvdkeras.callbacks.metric_average import MetricAverageCallback
from hvdkeras.training import lr_variable


class LearningRateLogger(keras.callbacks.Callback):
    """Writes the current learning rate into the epoch logs."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = lr_variable.get_learning_rate(self.model.optimizer)


class StopAtStep(keras.callbacks.Callback):
    """Stops after `total` batches in all (training.steps); same step on every rank.

    `batch_offset`: steps of the current epoch taken before this `fit()` (a
    run resumed mid-epoch, Note [exact resume] in hvdkeras/training/resume_state.py).
    """

    def __init__(self, total: int, steps_per_epoch: int):
        super().__init__()
        self.total, self.steps_per_epoch = total, steps_per_epoch
        self.batch_offset = 0
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._epoch * self.steps_per_epoch + self.batch_offset + batch + 1 >= self.total:
            self.model.stop_training = True


class Throughput(keras.callbacks.Callback):
    """Examples per second over all ranks, leaving out each epoch's first
    batch (tracing, and the validation pass before it)."""

    def __init__(self, global_batch: int):
        super().__init__()
        self.global_batch = global_batch
        self.seconds = 0.0
        self.batches = 0
        self._last: Optional[float] = None
        self._last_batch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._last = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if self._last is not None:
            self.seconds += now - self._last
            self.batches += batch - self._last_batch
        self._last, self._last_batch = now, batch

    @property
    def examples_per_second(self) -> Optional[float]:
        if self.seconds <= 0 or self.batches <= 0:
            return None
        return self.batches * self.global_batch / self.seconds


def tensorboard_callback(section: dict):
    try:
        return keras.callbacks.TensorBoard(
            log_dir=section["log_dir"], update_freq=section["update_freq"],
            histogram_freq=section["histogram_freq"], write_graph=section["write_graph"],
            profile_batch=section["profile_batch"])
    except ImportError as error:  # pragma: no cover - resolve.py checks this first
        raise RuntimeError("callbacks.tensorboard needs the 'tensorboard' package, which "
                           "TensorFlow 2.21 no longer installs: pip install tensorboard") from error


def make_callbacks(recipe: dict, rank: int, steps_per_epoch: int, total_batches: Optional[int],
                   global_batch: int) -> Tuple[list, Any]:
    """The callback list, in the order hvdkeras needs, and the throughput meter."""
    throughput = Throughput(global_batch)
    callbacks: list = [
        BroadcastGlobalVariablesCallback(0),
        MetricAverageCallback(),
        LearningRateLogger(),
        throughput,
        # Keras's own epoch line, placed here (Keras then adds no other) so
        # that it shows the averaged metrics and the learning rate but not
        # the figures below, which would double its length.
        keras.callbacks.ProgbarLogger(),
        # After the metric average, before the loggers: rank 0's figures
        # reach the history, the CSV log and TensorBoard.
        EngineStatsCallback(global_batch),
    ]
    if total_batches is not None:
        callbacks.append(StopAtStep(total_batches, steps_per_epoch))
    sections = recipe["callbacks"]
    if sections["gpu_stats"]:
        # Before the loggers, so their epoch records hold the GPU figures.
        callbacks.append(GPUStatsCallback())
    early = sections["early_stopping"]
    if early is not None:
        callbacks.append(keras.callbacks.EarlyStopping(
            monitor=early["monitor"], patience=early["patience"], min_delta=early["min_delta"],
            mode=early["mode"], restore_best_weights=early["restore_best_weights"],
            start_from_epoch=early["start_from_epoch"], verbose=1 if rank == 0 else 0))
    if rank == 0:
        if sections["csv_logger"] is not None:
            section = sections["csv_logger"]
            os.makedirs(os.path.dirname(section["path"]) or ".", exist_ok=True)
            callbacks.append(keras.callbacks.CSVLogger(section["path"], separator=section["separator"],
                                                       append=section["append"]))
        if sections["tensorboard"] is not None:
            callbacks.append(tensorboard_callback(sections["tensorboard"]))
    checkpoint = recipe["checkpoint"]
    if checkpoint is not None:
        callbacks.append(CheckpointCallback(
            checkpoint["dir"], keep_last=checkpoint["keep"], save_best_only=checkpoint["best_only"],
            monitor=checkpoint["monitor"], mode=checkpoint["mode"], verbose=0,
            every_steps=checkpoint["every_steps"]))
    return callbacks, throughput

"""Horovod's `BestModelCheckpoint`: keep the single best model, on rank 0."""

from __future__ import annotations

import os
from typing import Optional

import keras

from hvdkeras.callbacks._prepare import prepare_model
from hvdkeras.engine import world
from hvdkeras.host.objects import broadcast_object
from hvdkeras.sharding.sharded_optimizer import shard_holder
from hvdkeras.sharding.state_transfer import gathered_optimizer_state
from hvdkeras.training import checkpoint_naming
from hvdkeras.training.checkpoint_writing import save_model_atomic


class BestModelCheckpoint(keras.callbacks.Callback):
    """Saves the model to one file whenever `monitor` improves, on rank 0.

    Horovod's name and arguments (its Spark estimator sets `filepath` for
    the user; here it may also be given directly). The file is written
    atomically (a temporary file renamed over it), so a crash mid-write
    leaves the previous best intact. For numbered, prunable, resumable
    checkpoints use `CheckpointCallback`.

    Args:
        filepath: The `.keras` file to write (may be set later through the
            attribute, but before training starts).
        monitor: The epoch-log key to compare; put `MetricAverageCallback`
            earlier so it is the average over ranks.
        verbose: 1 prints a line on rank 0 when a better model is saved.
        mode: "min", "max" or "auto" (max for accuracy-like names).
        save_freq: "epoch", the only frequency (as in Horovod's use).

    Example:

    ```python
    best = hvd.callbacks.BestModelCheckpoint("best.keras", monitor="val_loss")
    model.fit(x, y, validation_split=0.1, callbacks=[hvd.callbacks.MetricAverageCallback(), best])
    ```
    """

    def __init__(self, filepath: Optional[str] = None, monitor: str = "val_loss",
                 verbose: int = 0, mode: str = "auto", save_freq: str = "epoch") -> None:
        super().__init__()
        if save_freq != "epoch":
            raise ValueError(f"BestModelCheckpoint compares epoch metrics, so save_freq must be "
                             f"'epoch', got {save_freq!r}.")
        self.filepath = filepath
        self.monitor = monitor
        self.verbose = verbose
        self.mode = checkpoint_naming.resolve_mode(mode, monitor)
        self.best: Optional[float] = None

    def set_model(self, model) -> None:
        super().set_model(model)
        prepare_model(model)

    def on_train_begin(self, logs=None) -> None:
        if not self.filepath:
            raise ValueError("BestModelCheckpoint has no filepath: pass one, or set "
                             "callback.filepath before fit().")
        if not os.fspath(self.filepath).endswith(".keras"):
            raise ValueError(f"BestModelCheckpoint writes Keras 3 model files, whose names end "
                             f"in '.keras'; got {self.filepath!r}.")

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        value = (logs or {}).get(self.monitor)
        better = value is not None and checkpoint_naming.improved(float(value), self.best,
                                                                   self.mode)
        sharded = shard_holder(getattr(self.model, "optimizer", None)) is not None
        if sharded:  # rank 0 decides; a sharded save needs every rank, in step
            better = broadcast_object(better, root_rank=0, name="hvdkeras_best_model_decision")
        if not better:
            return
        if value is not None:
            self.best = float(value)
        if world.rank() != 0 and not sharded:
            return
        with gathered_optimizer_state(self.model):
            if world.rank() != 0:
                return
            directory = os.path.dirname(os.path.abspath(self.filepath))
            os.makedirs(directory, exist_ok=True)
            save_model_atomic(self.model, os.fspath(self.filepath))
        if self.verbose:
            print(f"hvdkeras: epoch {epoch + 1}: {self.monitor} improved to {value:.6g}; "
                  f"saved {self.filepath}", flush=True)

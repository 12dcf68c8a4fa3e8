"""Rank-0 checkpoints: atomic, pruned, optionally best-only or every N steps, resumable."""

from __future__ import annotations

import json
import os
from typing import Optional

import keras

from hvdkeras.callbacks._prepare import prepare_model
from hvdkeras.engine import world
from hvdkeras.host.objects import broadcast_object
from hvdkeras.sharding.sharded_optimizer import shard_holder
from hvdkeras.sharding.state_transfer import gathered_optimizer_state
from hvdkeras.training import checkpoint_naming
from hvdkeras.training.checkpoint_writing import save_model_atomic, write_json_atomic
from hvdkeras.training.resume_state import resume_state


class CheckpointCallback(keras.callbacks.Callback):
    """Saves the whole model (with optimizer state) at epoch ends, on rank 0.

    Only rank 0 touches the filesystem; the other ranks do nothing here. Each
    checkpoint is `directory/epoch-NNNNN.keras` (NNNNN = finished epochs),
    written to a temporary file in the same directory and renamed when
    complete, so a crash mid-write leaves the previous checkpoints intact.
    Leftover temporary files are removed when training starts. Resume with
    `hvdkeras.restore_from_checkpoint(model, directory)`.

    With `save_best_only`, an epoch is saved only when `monitor` improved;
    put `MetricAverageCallback` earlier in the list so the decision uses the
    average over ranks. The best value is kept in
    `directory/checkpoint_state.json` and survives restarts.

    Each checkpoint also carries what Keras leaves out of `model.save()` but
    the next step depends on: its position (finished epochs, steps into the
    next epoch) and the state of every layer's random generator (Dropout and
    the like), so that `hvdkeras.restore_training_position` resumes exactly.
    With `every_steps`, a checkpoint `epoch-E-step-S.keras` is also written
    every `every_steps` steps within an epoch.

    Args:
        directory: Where checkpoints go (created on rank 0 if missing).
        keep_last: How many of the newest checkpoints to keep (None: all).
        save_best_only: Save only epochs that improve `monitor`.
        monitor: The epoch-log key compared with `save_best_only`.
        mode: "min", "max" or "auto" (max for accuracy-like names).
        verbose: 1 prints a line on rank 0 for every checkpoint written.
        every_steps: Also save every this many steps within an epoch (None:
            at epoch ends only). Not combinable with `save_best_only`.

    Attributes:
        batch_offset: Steps of the current epoch that ran before this `fit()`
            (a run resumed mid-epoch); step checkpoints count from there.

    Example:

    ```python
    ckpt = hvd.callbacks.CheckpointCallback("checkpoints", keep_last=3)
    initial_epoch = hvd.restore_from_checkpoint(model, "checkpoints")
    model.fit(x, y, epochs=10, initial_epoch=initial_epoch, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(), ckpt])
    ```
    """

    def __init__(self, directory: str, keep_last: Optional[int] = 3, save_best_only: bool = False,
                 monitor: str = "val_loss", mode: str = "auto", verbose: int = 0,
                 every_steps: Optional[int] = None) -> None:
        super().__init__()
        if keep_last is not None and (not isinstance(keep_last, int) or keep_last < 1):
            raise ValueError(f"keep_last must be None or an integer >= 1, got {keep_last!r}.")
        if every_steps is not None and (not isinstance(every_steps, int) or every_steps < 1):
            raise ValueError(f"every_steps must be None or an integer >= 1, got {every_steps!r}.")
        if every_steps is not None and save_best_only:
            raise ValueError("every_steps saves mid-epoch checkpoints for resuming, which "
                             "save_best_only would prune by a metric; use one or the other.")
        self.every_steps = every_steps
        self.batch_offset = 0
        self._epoch = 0
        self.directory = os.fspath(directory)
        self.keep_last = keep_last
        self.save_best_only = save_best_only
        self.monitor = monitor
        self.mode = checkpoint_naming.resolve_mode(mode, monitor)
        self.verbose = verbose
        self.best: Optional[float] = None
        self._warned_missing = False

    def set_model(self, model) -> None:
        super().set_model(model)
        prepare_model(model)

    @property
    def _state_path(self) -> str:
        return os.path.join(self.directory, checkpoint_naming.STATE_FILE)

    def on_train_begin(self, logs=None) -> None:
        if world.rank() != 0:
            return
        os.makedirs(self.directory, exist_ok=True)
        for name in os.listdir(self.directory):
            if checkpoint_naming.is_temporary(name):
                os.remove(os.path.join(self.directory, name))
        if self.save_best_only and os.path.exists(self._state_path):
            with open(self._state_path) as f:
                state = json.load(f)
            if state.get("monitor") == self.monitor and state.get("mode") == self.mode:
                self.best = state.get("best")

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._epoch = epoch

    def _epoch_steps(self) -> int:
        return self.batch_offset + ((self.params or {}).get("steps") or 0)

    def _sharded(self) -> bool:
        """Whether saving needs every rank: the optimizer's state is sharded."""
        return shard_holder(getattr(self.model, "optimizer", None)) is not None

    def on_train_batch_end(self, batch: int, logs=None) -> None:
        if self.every_steps is None or (world.rank() != 0 and not self._sharded()):
            return
        step = self.batch_offset + batch + 1
        if step % self.every_steps == 0 and step < self._epoch_steps():  # the epoch end saves the last
            self._save(self._epoch, step)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        sharded = self._sharded()
        if world.rank() != 0 and not sharded:
            return
        save = self._epoch_wanted(logs or {}) if world.rank() == 0 else None
        if sharded:  # rank 0 decides; the others must join its save
            save = broadcast_object(save, root_rank=0, name="hvdkeras_checkpoint_decision")
        if not save:
            return
        self._save(epoch + 1, 0)
        if self.save_best_only and world.rank() == 0:
            write_json_atomic(self._state_path,
                              {"monitor": self.monitor, "mode": self.mode, "best": self.best})

    def _epoch_wanted(self, logs: dict) -> bool:
        """On rank 0: whether this epoch is saved (updates the best value)."""
        if self.save_best_only:
            value = logs.get(self.monitor)
            if value is None:
                if not self._warned_missing:
                    self._warned_missing = True
                    print(f"hvdkeras: CheckpointCallback cannot find {self.monitor!r} in the epoch "
                          f"logs ({sorted(logs)}); nothing is saved.", flush=True)
                return False
            if not checkpoint_naming.improved(float(value), self.best, self.mode):
                return False
            self.best = float(value)
        return True

    def _save(self, epochs: int, step: int) -> None:
        """Writes the checkpoint at `epochs` finished epochs and `step` steps of
        the next (on rank 0; every rank calls it when the state is sharded)."""
        with gathered_optimizer_state(self.model):
            if world.rank() == 0:
                self._write(epochs, step)

    def _write(self, epochs: int, step: int) -> None:
        path = os.path.join(self.directory, checkpoint_naming.checkpoint_name(epochs, step))
        state = resume_state(self.model, epochs, step, world.size(), self._epoch_steps())
        save_model_atomic(self.model, path, resume_state=state)
        for name in checkpoint_naming.files_to_prune(os.listdir(self.directory), self.keep_last):
            os.remove(os.path.join(self.directory, name))
        if self.verbose:
            where = f"epoch {epochs}" if not step else f"epoch {epochs + 1}, step {step}"
            print(f"hvdkeras: {where}: saved {path}", flush=True)


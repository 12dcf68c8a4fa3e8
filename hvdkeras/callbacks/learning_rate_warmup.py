"""Gradual learning-rate warmup over the first epochs (Goyal et al., 2017)."""

from __future__ import annotations

from typing import Optional

from hvdkeras.engine import world
from hvdkeras.callbacks.learning_rate_schedule import (LearningRateScheduleCallback,
                                                        check_no_momentum_correction)
from hvdkeras.training import lr_formulas, lr_variable
from hvdkeras.training.output import print_rank0


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Raises the rate linearly from `initial_lr / size` to `initial_lr`.

    At every batch of the first `warmup_epochs` epochs the rate is
    `initial_lr / size * (e * (size - 1) / warmup_epochs + 1)` with
    `e = epoch + (batch + 1) / steps_per_epoch`, so the last warmup batch
    runs at `initial_lr`. Large global batches train unstably at the full
    scaled rate from step 1; the ramp avoids that. After warmup the rate is
    left alone (combine with `LearningRateScheduleCallback` from
    `start_epoch=warmup_epochs`).

    Prefer `hvdkeras.schedules.WarmupSchedule` when you use
    `steps_per_execution` > 1 or a schedule already.

    Args:
        initial_lr: The rate at the end of warmup, already scaled by the
            number of ranks (`hvdkeras.scale_lr`).
        warmup_epochs: Length of the warmup in epochs.
        steps_per_epoch: Batches per epoch; by default what `fit()` reports.
        verbose: 1 prints a line on rank 0 when warmup ends.
        momentum_correction: Accepted for Horovod compatibility; only False
            works (see `LearningRateScheduleCallback`).

    Example:

    ```python
    lr = hvd.scale_lr(0.01)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr)), loss="mse")
    model.fit(x, y, epochs=20, callbacks=[
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(lr, warmup_epochs=3)])
    ```
    """

    def __init__(self, initial_lr: float, warmup_epochs: int = 5,
                 steps_per_epoch: Optional[int] = None, verbose: int = 0,
                 momentum_correction: bool = False) -> None:
        check_no_momentum_correction(momentum_correction, type(self).__name__)
        if warmup_epochs <= 0:
            raise ValueError(f"warmup_epochs must be positive, got {warmup_epochs!r}.")
        super().__init__(initial_lr, multiplier=self._ramp, start_epoch=0,
                         end_epoch=warmup_epochs, staircase=False,
                         steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def _ramp(self, epoch: float) -> float:
        return lr_formulas.warmup_multiplier(epoch, self.warmup_epochs, world.size())

    def _epoch_value(self, batch: int) -> float:
        return lr_formulas.warmup_epoch_at_batch(self._epoch, batch, self._steps)

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1 and self.verbose:
            rate = lr_variable.get_learning_rate(self.model.optimizer)
            print_rank0(f"epoch {epoch + 1}: finished gradual learning rate warmup to {rate:.6g}.")

"""A learning rate set per epoch (or per batch) from a multiplier of the epoch."""

from __future__ import annotations

from typing import Callable, Optional, Union

import keras

from hvdkeras.training import lr_formulas, lr_variable
from hvdkeras.callbacks._prepare import prepare_model


def check_no_momentum_correction(momentum_correction: bool, who: str) -> None:
    """Refuses Horovod's momentum correction, which Keras 3 cannot honour."""
    if momentum_correction:
        raise ValueError(
            f"{who}(momentum_correction=True) cannot work with Keras 3: an optimizer's "
            "momentum is a Python float read once when the train step is traced, so changing "
            "it from a callback has no effect. Pass momentum_correction=False (the default)."
        )


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets `lr = initial_lr * multiplier(epoch)` for epochs in [start, end).

    With `staircase=True` the rate is set at the first batch of each epoch
    from the integer epoch; with `staircase=False` it is set at every batch
    from the fractional epoch `epoch + batch / steps_per_epoch`. A constant
    `multiplier` m means `m ** (epoch - start_epoch)` and always steps per
    epoch (as in Horovod). Outside the range the rate is left as it is, so
    several of these callbacks can cover consecutive ranges. The current rate
    is written to the epoch logs as `"learning_rate"`.

    The rate is the optimizer's learning-rate variable; an optimizer built
    with a `LearningRateSchedule` is rejected with an explanation. With
    `steps_per_execution` > 1, batch callbacks fire once per execution, so
    per-batch rates change in steps of that size; use a schedule
    (`hvdkeras.schedules.WarmupSchedule`) for exact per-step rates.

    Args:
        initial_lr: The base rate (usually already scaled by the number of
            ranks).
        multiplier: A number, or a function of the (fractional) epoch.
        start_epoch: First epoch (0-based) the callback acts in.
        end_epoch: The epoch it stops acting at (exclusive); None: never.
        staircase: Step at epoch boundaries (True) or change every batch.
        steps_per_epoch: Batches per epoch; by default what `fit()` reports.
        momentum_correction: Accepted for Horovod compatibility; only False
            works (Keras 3 fixes `momentum` when the train step is traced, so
            a callback cannot rescale it).

    Example:

    ```python
    # Divide the rate by 10 at epochs 30 and 60.
    callbacks += [
        hvd.callbacks.LearningRateScheduleCallback(lr, 1.0, start_epoch=0, end_epoch=30),
        hvd.callbacks.LearningRateScheduleCallback(lr, 0.1, start_epoch=30, end_epoch=60),
        hvd.callbacks.LearningRateScheduleCallback(lr, 0.01, start_epoch=60),
    ]
    ```
    """

    def __init__(self, initial_lr: float, multiplier: Union[float, Callable[[float], float]],
                 start_epoch: int = 0, end_epoch: Optional[int] = None, staircase: bool = True,
                 steps_per_epoch: Optional[int] = None, momentum_correction: bool = False) -> None:
        super().__init__()
        check_no_momentum_correction(momentum_correction, type(self).__name__)
        self.initial_lr = float(initial_lr)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.steps_per_epoch = steps_per_epoch
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lr_formulas.constant_multiplier(float(multiplier), start_epoch)
            self.staircase = True
        self._epoch = 0
        self._steps: Optional[int] = None

    def set_model(self, model) -> None:
        super().set_model(model)
        prepare_model(model)

    def _who(self) -> str:
        return type(self).__name__

    def _resolve_steps_per_epoch(self) -> Optional[int]:
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps and not self.staircase:
            raise ValueError(
                f"{self._who()} changes the rate every batch and needs the number of batches per "
                "epoch, which fit() does not know for this input (e.g. a dataset of unknown "
                "length): pass steps_per_epoch= to the callback."
            )
        return steps

    def on_train_begin(self, logs=None) -> None:
        lr_variable.check_settable(self.model.optimizer, self._who())
        self._steps = self._resolve_steps_per_epoch()

    def on_epoch_begin(self, epoch: int, logs=None) -> None:
        self._epoch = epoch

    def _epoch_value(self, batch: int) -> float:
        return lr_formulas.fractional_epoch(self._epoch, batch, self._steps)

    def on_train_batch_begin(self, batch: int, logs=None) -> None:
        if not lr_formulas.in_epoch_range(self._epoch, self.start_epoch, self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                lr_variable.set_learning_rate(self.model.optimizer,
                                            self.initial_lr * self.multiplier(self._epoch))
            return
        lr_variable.set_learning_rate(self.model.optimizer,
                                    self.initial_lr * self.multiplier(self._epoch_value(batch)))

    def on_epoch_end(self, epoch: int, logs=None) -> None:
        if logs is not None:
            logs["learning_rate"] = lr_variable.get_learning_rate(self.model.optimizer)

"""Reading and setting the learning-rate variable of a Keras 3 optimizer
(what the learning-rate callbacks change each epoch or batch).

What may import this module: the callbacks and the recipes' training code.
"""

from __future__ import annotations

from typing import Any

import keras

from hvdkeras import compat


def _owner(optimizer: Any) -> Any:
    """The optimizer that holds the learning rate (inside loss-scale wrappers)."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def check_settable(optimizer: Any, who: str) -> None:
    """Raises a clear error unless the learning rate is a variable a callback may set."""
    if optimizer is None:
        raise ValueError(f"{who} needs a compiled model with an optimizer.")
    multi = getattr(keras.optimizers, "MultiOptimizer", None)  # absent in older Keras 3
    if multi is not None and isinstance(_owner(optimizer), multi):
        raise TypeError(
            f"{who} cannot drive a MultiOptimizer: each of its inner optimizers has its own "
            "learning rate. Give the inner optimizers schedules instead "
            "(e.g. hvdkeras.schedules.WarmupSchedule)."
        )
    learning_rate = compat.optimizer_learning_rate_holder(_owner(optimizer))
    if isinstance(learning_rate, keras.Variable):
        return
    kind = type(learning_rate).__name__
    raise TypeError(
        f"{who} sets the optimizer's learning rate each epoch or batch, but this optimizer's "
        f"learning rate is a {kind} (a schedule evaluated inside the train step), which a "
        "callback cannot overwrite. Either give the optimizer a float learning rate, or keep "
        "the schedule and drop the callback: for warmup use "
        "hvdkeras.schedules.WarmupSchedule(target, warmup_steps, after=your_schedule)."
    )


def get_learning_rate(optimizer: Any) -> float:
    """The current learning rate as a Python float."""
    return float(keras.ops.convert_to_numpy(_owner(optimizer).learning_rate))


def set_learning_rate(optimizer: Any, value: float) -> None:
    """Assigns the learning-rate variable (takes effect without retracing)."""
    _owner(optimizer).learning_rate = float(value)

"""Learning-rate helpers for N-rank training: `scale_lr` and `WarmupSchedule`.

Schedules run inside the train step, every step (also under
`steps_per_execution`), and their position comes from the optimizer's
iteration count, which is saved in checkpoints: they resume exactly. Prefer
them to the learning-rate callbacks when you can.

What may import this module: the recipes' training code and the top-level
package (as `hvdkeras.schedules`).
"""

from __future__ import annotations

from typing import Any, Optional

import keras
from keras import ops

from hvdkeras.engine import world
from hvdkeras.training.lr_formulas import warmup_multiplier


def _world_size() -> int:
    if not world.is_initialized():
        raise ValueError(
            "The world size is not known yet: call hvdkeras.init() first, or pass size= explicitly."
        )
    return world.size()


def scale_lr(learning_rate: float) -> float:
    """Multiplies a single-process learning rate by the number of ranks.

    N ranks with batch B train on a global batch of N*B; the usual linear
    scaling rule (Goyal et al., 2017) multiplies the learning rate by N. Scale
    once, when creating the optimizer: the scaled value is what checkpoints
    then hold.

    Args:
        learning_rate: The learning rate tuned for one process.

    Returns:
        `learning_rate * hvdkeras.size()`.

    Example:

    ```python
    opt = keras.optimizers.SGD(hvd.scale_lr(0.01), momentum=0.9)
    ```
    """
    if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise TypeError(
            "scale_lr takes a number. For a schedule, scale its initial value yourself or use "
            "hvdkeras.schedules.WarmupSchedule(target=hvdkeras.scale_lr(lr), ...)."
        )
    return float(learning_rate) * _world_size()


@keras.saving.register_keras_serializable(package="hvdkeras")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear learning-rate warmup for large global batches, then any schedule.

    During the first `warmup_steps` steps the rate rises linearly from
    `target / size` to `target` (Goyal et al., 2017):
    `target / size * (1 + step * (size - 1) / warmup_steps)`. From step
    `warmup_steps` on it is `after(step - warmup_steps)`, or `target` without
    `after`. With one rank the warmup is flat at `target`.

    Args:
        target: The learning rate reached at the end of warmup, normally
            already scaled by the number of ranks (`hvdkeras.scale_lr`).
        warmup_steps: Optimizer steps (updates) the warmup lasts.
        after: Optional `LearningRateSchedule` (or callable of the step) used
            after warmup; it starts at its own step 0.
        size: The number of ranks; defaults to `hvdkeras.size()`. Saved in
            the config, so a loaded schedule keeps the size it was made for.

    Example:

    ```python
    decay = keras.optimizers.schedules.CosineDecay(hvd.scale_lr(0.1), decay_steps=10_000)
    lr = hvd.schedules.WarmupSchedule(hvd.scale_lr(0.1), warmup_steps=500, after=decay)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))
    ```
    """

    def __init__(self, target: float, warmup_steps: int, after: Optional[Any] = None,
                 size: Optional[int] = None) -> None:
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps!r}.")
        if after is not None and not callable(after):
            raise TypeError(
                f"after must be a LearningRateSchedule or a callable of the step, got {after!r}."
            )
        self.target = float(target)
        self.warmup_steps = int(warmup_steps)
        self.after = after
        self.size = int(size) if size is not None else _world_size()
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}.")

    def __call__(self, step):
        step = ops.cast(step, "float32")
        if self.after is not None:
            post = ops.cast(self.after(ops.maximum(step - self.warmup_steps, 0.0)), "float32")
        else:
            post = ops.convert_to_tensor(self.target, "float32")
        if self.warmup_steps == 0:
            return post
        ramp = self.target * warmup_multiplier(step, self.warmup_steps, self.size)
        return ops.where(step < self.warmup_steps, ramp, post)

    def get_config(self) -> dict:
        after = self.after
        if after is not None:
            after = keras.saving.serialize_keras_object(after)
        return {"target": self.target, "warmup_steps": self.warmup_steps,
                "after": after, "size": self.size}

    @classmethod
    def from_config(cls, config: dict) -> "WarmupSchedule":
        config = dict(config)
        if config.get("after") is not None:
            config["after"] = keras.saving.deserialize_keras_object(config["after"])
        return cls(**config)

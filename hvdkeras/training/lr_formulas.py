"""Learning-rate formulas as plain functions (no TensorFlow, no MPI).

The callbacks, `WarmupSchedule` and the recipes' learning-rate plan use
them; the tests check them directly.

What may import this module: anything (it imports nothing).
"""

from __future__ import annotations

from typing import Callable, Optional


def constant_multiplier(factor: float, start_epoch: float) -> Callable[[float], float]:
    """The multiplier of a constant decay factor: `factor ** (epoch - start_epoch)`."""
    return lambda epoch: factor ** (epoch - start_epoch)


def fractional_epoch(epoch: int, batch: int, steps_per_epoch: int) -> float:
    """`epoch + batch / steps_per_epoch`: the epoch as a real number at a batch."""
    return epoch + batch / steps_per_epoch


def in_epoch_range(epoch: float, start_epoch: float, end_epoch: Optional[float]) -> bool:
    """Whether `epoch` lies in [start_epoch, end_epoch) (no end: unbounded)."""
    return epoch >= start_epoch and (end_epoch is None or epoch < end_epoch)


def warmup_multiplier(epoch: float, warmup_epochs: float, size: int) -> float:
    """The Goyal et al. (2017) ramp: 1/size at epoch 0, 1 at `warmup_epochs`.

    `(1 / size) * (epoch * (size - 1) / warmup_epochs + 1)`.
    """
    return (epoch * (size - 1) / warmup_epochs + 1.0) / size


def warmup_epoch_at_batch(epoch: int, batch: int, steps_per_epoch: int) -> float:
    """The epoch value the warmup callback uses at a batch: the end of the batch.

    `epoch + (batch + 1) / steps_per_epoch`, so the last batch of the last
    warmup epoch reaches the full learning rate.
    """
    return epoch + (batch + 1) / steps_per_epoch


def warmup_learning_rate(step: float, target: float, warmup_steps: float, size: int) -> float:
    """`WarmupSchedule`'s value during warmup: target/size at step 0, rising
    linearly to `target` at `warmup_steps`."""
    return target * warmup_multiplier(step, warmup_steps, size)

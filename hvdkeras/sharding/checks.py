"""What sharding optimizer state needs of the settings and the optimizer,
checked before anything is built (the same checks under every backend).

What may import this module: `hvdkeras.training` and `hvdkeras.backends`.
"""

from __future__ import annotations

from typing import Any

import keras

from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Adasum


def check_zero_stage(zero_stage: int, op: int, process_set: ProcessSet, optimizer: Any,
                     backward_passes_per_step: int = 1) -> None:
    """Raises ValueError, naming the fix, when `DistributedOptimizer(optimizer,
    zero_stage=...)` cannot shard this optimizer's state (every backend)."""
    if zero_stage not in (0, 1, 2, 3) or isinstance(zero_stage, bool):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {zero_stage!r}.")
    if not zero_stage:
        return
    if op == Adasum:
        raise ValueError(f"zero_stage={zero_stage} needs op=hvdkeras.Average or Sum: Adasum combines "
                         "whole gradients and cannot be split by owner. Use zero_stage=0.")
    if process_set is not global_process_set:
        raise ValueError(f"zero_stage={zero_stage} shards state across all ranks and takes no "
                         "process_set; use zero_stage=0 with process_set=.")
    holder = getattr(optimizer, "inner_optimizer", optimizer)
    multi = getattr(keras.optimizers, "MultiOptimizer", None)  # absent in older Keras 3
    if multi is not None and isinstance(holder, multi):
        raise ValueError(f"zero_stage={zero_stage} cannot shard a MultiOptimizer (its state lives in "
                         "several inner optimizers). Use zero_stage=0.")
    if holder.built:
        raise ValueError(
            f"zero_stage={zero_stage} needs an optimizer that has no slots yet, but "
            f"{holder.name!r} is built. Wrap it before compile()/fit() or build(); for a loaded "
            "model, compile it again with a new optimizer and load the checkpoint after.")
    if zero_stage == 3 and getattr(holder, "use_ema", False):
        raise ValueError("zero_stage=3 does not keep an EMA of the weights yet (the average "
                         "would be overwritten into weights each rank holds in part). Use "
                         "zero_stage=2 with use_ema=True, or turn the EMA off.")
    if zero_stage == 3 and backward_passes_per_step > 1:
        raise ValueError("zero_stage=3 does not accumulate gradients over several passes yet "
                         "(backward_passes_per_step > 1); use Keras's "
                         "gradient_accumulation_steps, or zero_stage=2.")

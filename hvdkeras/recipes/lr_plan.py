"""The numbers behind a recipe's learning rate: the scaled base rate, the
warmup and decay lengths in optimizer steps. Plain arithmetic; the Keras
schedule objects are made from it in `hvdkeras.recipes.keras_objects`.

What may import this module: the rest of `hvdkeras.recipes` (pure Python).
"""

from __future__ import annotations

from typing import Any, Dict, Optional


def steps_from(value_steps: Optional[int], value_epochs: Optional[float],
               updates_per_epoch: float) -> Optional[int]:
    """A length given in steps or epochs, in optimizer steps (at least 1)."""
    if value_steps is not None:
        return int(value_steps)
    if value_epochs is not None:
        return max(1, int(round(value_epochs * updates_per_epoch)))
    return None


def schedule_plan(recipe: dict, size: int, steps_per_epoch: int,
                  total_batches: int) -> Dict[str, Any]:
    """The numbers behind the learning rate: base rate, warmup length, decay.

    Args:
        recipe: A normalized recipe.
        size: The number of ranks.
        steps_per_epoch: Batches per epoch on each rank.
        total_batches: Batches the run takes in all (epochs x steps, or
            training.steps).

    Returns:
        {"base": scaled learning rate, "warmup_steps": int (0: none),
         "schedule": the schedule section or None, "decay_steps": int or None,
         "boundaries": list of int or None, "updates_per_epoch": float,
         "total_updates": int}. Steps here are optimizer updates (batches
         divided by backward_passes_per_step).
    """
    opt = recipe["optimizer"]
    passes = opt["backward_passes_per_step"]
    updates_per_epoch = steps_per_epoch / passes
    total_updates = max(1, total_batches // passes)
    base = opt["learning_rate"] * (size if opt["scale_by_world_size"] else 1)
    warmup = opt["warmup"]
    warmup_steps = 0
    if warmup is not None:
        warmup_steps = steps_from(warmup["steps"], warmup["epochs"], updates_per_epoch) or 0
    plan: Dict[str, Any] = {"base": base, "warmup_steps": warmup_steps,
                            "schedule": opt["schedule"], "decay_steps": None,
                            "boundaries": None, "updates_per_epoch": updates_per_epoch,
                            "total_updates": total_updates}
    schedule = opt["schedule"]
    if schedule is not None:
        decay = steps_from(schedule.get("decay_steps"), schedule.get("decay_epochs"),
                           updates_per_epoch)
        if decay is None and schedule["name"] in ("cosine", "polynomial"):
            decay = max(1, total_updates - warmup_steps)
        plan["decay_steps"] = decay
        if schedule["name"] == "piecewise":
            if schedule["boundaries"] is not None:
                plan["boundaries"] = list(schedule["boundaries"])
            else:
                plan["boundaries"] = [steps_from(None, e, updates_per_epoch)
                                      for e in schedule["boundary_epochs"]]
    return plan

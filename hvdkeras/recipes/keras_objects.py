"""The Keras objects a recipe names: optimizers, losses, metrics, and the
learning rate (a float or a schedule) from the plan in `lr_plan`.

What may import this module: the rest of `hvdkeras.recipes` (it imports Keras).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import keras

from hvdkeras.recipes import lr_plan
from hvdkeras.collectives.compression import Compression
from hvdkeras.training.optimizer import DistributedOptimizer
from hvdkeras.training.schedules import WarmupSchedule

_NOT_USER_OPTIMIZERS = {"Optimizer", "LossScaleOptimizer", "MultiOptimizer"}


def _squash(name: str) -> str:
    return name.replace("_", "").lower()


def optimizer_classes() -> Dict[str, type]:
    """keras.optimizers classes by lower-case name ('adam': Adam, ...)."""
    found = {}
    for name in dir(keras.optimizers):
        item = getattr(keras.optimizers, name)
        if isinstance(item, type) and issubclass(item, keras.optimizers.Optimizer) \
                and name not in _NOT_USER_OPTIMIZERS:
            found[name.lower()] = item
    return found


def _module_classes(module, base) -> Dict[str, type]:
    return {_squash(n): getattr(module, n) for n in dir(module)
            if isinstance(getattr(module, n), type) and issubclass(getattr(module, n), base)}


def loss_names() -> List[str]:
    return sorted(n for n in dir(keras.losses) if not n.startswith("_")
                  and n not in ("get", "serialize", "deserialize", "Loss", "Reduction"))


def metric_names() -> List[str]:
    names = [n for n in dir(keras.metrics) if not n.startswith("_")
             and n not in ("get", "serialize", "deserialize", "Metric", "MeanMetricWrapper")]
    return sorted(names + ["accuracy", "acc", "crossentropy", "ce"])


def _with_args(module: Any, base: type, where: str, spec: dict):
    """An instance of the class in `module` named spec['name'], built with spec['args']."""
    cls = _module_classes(module, base).get(_squash(spec["name"]))
    if cls is None:
        raise ValueError(f"no {where} class named {spec['name']!r} takes arguments")
    return cls(**spec["args"])


def make_loss(spec: Any):
    """A loss for compile(): a name, or {name, args} (class found by name)."""
    if isinstance(spec, str):
        return keras.losses.get(spec)
    return _with_args(keras.losses, keras.losses.Loss, "keras.losses", spec)


def make_metric(spec: Any):
    """A metric for compile(): 'accuracy' and friends pass through as strings."""
    if isinstance(spec, str):
        if spec in ("accuracy", "acc", "crossentropy", "ce"):
            return spec
        return keras.metrics.get(spec)
    return _with_args(keras.metrics, keras.metrics.Metric, "keras.metrics", spec)


def make_learning_rate(recipe: dict, size: int, steps_per_epoch: int,
                       total_batches: int) -> Tuple[Any, Dict[str, Any]]:
    """(float or LearningRateSchedule, the plan from `lr_plan.schedule_plan`)."""
    plan = lr_plan.schedule_plan(recipe, size, steps_per_epoch, total_batches)
    base, schedule = plan["base"], plan["schedule"]
    schedules = keras.optimizers.schedules
    after = None
    if schedule is not None and schedule["name"] != "constant":
        name, decay = schedule["name"], plan["decay_steps"]
        if name == "cosine":
            after = schedules.CosineDecay(base, decay, alpha=schedule["alpha"])
        elif name == "exponential":
            after = schedules.ExponentialDecay(base, decay, schedule["decay_rate"],
                                               staircase=schedule["staircase"])
        elif name == "inverse_time":
            after = schedules.InverseTimeDecay(base, decay, schedule["decay_rate"],
                                               staircase=schedule["staircase"])
        elif name == "polynomial":
            after = schedules.PolynomialDecay(base, decay,
                                              end_learning_rate=base * schedule["end_multiplier"],
                                              power=schedule["power"])
        elif name == "piecewise":
            after = schedules.PiecewiseConstantDecay(
                plan["boundaries"], [base * m for m in schedule["multipliers"]])
    if plan["warmup_steps"]:
        return WarmupSchedule(base, plan["warmup_steps"], after=after, size=size), plan
    if after is not None:
        return after, plan
    return base, plan


def make_optimizer(recipe: dict, learning_rate: Any):
    """The recipe's Keras optimizer wrapped in hvdkeras.DistributedOptimizer."""
    opt = recipe["optimizer"]
    cls = optimizer_classes()[opt["name"].lower()]
    optimizer = cls(learning_rate=learning_rate, **opt["args"])
    compression = getattr(Compression, opt["compression"])
    return DistributedOptimizer(
        optimizer, compression=compression,
        backward_passes_per_step=opt["backward_passes_per_step"],
        zero_stage=recipe["training"]["zero_stage"])

"""The recipe schema's optimizer section: learning rate, warmup and schedule.

What may import this module: `hvdkeras.recipes.schema` (pure Python).
"""

from __future__ import annotations

from typing import Dict, Tuple

from hvdkeras.recipes.spec import (AnyMap, Bool, Context, Field, Float, Int, ListOf, Map,
                                   Nullable, Str, require_one_of)
from hvdkeras.recipes.yaml_source import Path

SCHEDULES = ("constant", "cosine", "exponential", "inverse_time", "piecewise", "polynomial")
COMPRESSIONS = ("none", "fp16", "bf16")


def _check_warmup(value: dict, path: Path, ctx: Context) -> None:
    require_one_of(value, ("epochs", "steps"), path, ctx)


WARMUP = Map({
    "epochs": Field(Nullable(Float(0.0, low_open=True))),
    "steps": Field(Nullable(Int(1))),
}, what="the warmup section ({epochs: E} or {steps: S})", post=_check_warmup)

SCHEDULE_KEYS: Dict[str, Tuple[str, ...]] = {
    "constant": (),
    "cosine": ("decay_steps", "decay_epochs", "alpha"),
    "exponential": ("decay_rate", "decay_steps", "decay_epochs", "staircase"),
    "inverse_time": ("decay_rate", "decay_steps", "decay_epochs", "staircase"),
    "piecewise": ("boundaries", "boundary_epochs", "multipliers"),
    "polynomial": ("decay_steps", "decay_epochs", "end_multiplier", "power"),
}


def _check_schedule(value: dict, path: Path, ctx: Context) -> None:
    name = value["name"]
    raw = ctx.value_at(path)
    for key in value:
        if key != "name" and key not in SCHEDULE_KEYS[name] and isinstance(raw, dict) \
                and raw.get(key) is not None:
            keys = ", ".join(SCHEDULE_KEYS[name]) or "none"
            ctx.error(path + (key,), f"is not used by the {name!r} schedule; its keys: {keys}")
    if {"decay_steps", "decay_epochs"} & set(SCHEDULE_KEYS[name]):
        require_one_of(value, ("decay_steps", "decay_epochs"), path, ctx, at_most=True)
    if name in ("exponential", "inverse_time"):
        if value["decay_rate"] is None:
            ctx.error(path, f"the {name!r} schedule needs 'decay_rate'")
        if value["decay_steps"] is None and value["decay_epochs"] is None:
            value["decay_epochs"] = 1.0
        if value["staircase"] is None:
            value["staircase"] = False
    if name == "cosine" and value["alpha"] is None:
        value["alpha"] = 0.0
    if name == "polynomial":
        value["end_multiplier"] = 1e-4 if value["end_multiplier"] is None else value["end_multiplier"]
        value["power"] = 1.0 if value["power"] is None else value["power"]
    if name == "piecewise":
        which = require_one_of(value, ("boundaries", "boundary_epochs"), path, ctx)
        multipliers = value["multipliers"]
        if multipliers is None:
            ctx.error(path, "the 'piecewise' schedule needs 'multipliers' (one more than "
                            "boundaries): the learning rate in each piece is learning_rate * m")
        elif which is not None:
            bounds = value[which]
            if len(multipliers) != len(bounds) + 1:
                ctx.error(path + ("multipliers",), f"has {len(multipliers)} values; with "
                                                  f"{len(bounds)} {which} it needs "
                                                  f"{len(bounds) + 1}")
            if any(later <= earlier for earlier, later in zip(bounds, bounds[1:])):
                ctx.error(path + (which,), f"must increase strictly, got {bounds}")


SCHEDULE = Map({
    "name": Field(Str(choices=SCHEDULES), required=True),
    "decay_steps": Field(Nullable(Int(1))),
    "decay_epochs": Field(Nullable(Float(0.0, low_open=True))),
    "alpha": Field(Nullable(Float(0.0, 1.0)), help="cosine: final rate as a fraction"),
    "decay_rate": Field(Nullable(Float(0.0, low_open=True))),
    "staircase": Field(Nullable(Bool())),
    "boundaries": Field(Nullable(ListOf(Int(1), min_len=1))),
    "boundary_epochs": Field(Nullable(ListOf(Float(0.0, low_open=True), min_len=1))),
    "multipliers": Field(Nullable(ListOf(Float(0.0), min_len=1))),
    "end_multiplier": Field(Nullable(Float(0.0))),
    "power": Field(Nullable(Float(0.0, low_open=True))),
}, what="the schedule section", post=_check_schedule)


def _check_optimizer(value: dict, path: Path, ctx: Context) -> None:
    for key in ("learning_rate", "lr"):
        if key in value["args"]:
            ctx.error(path + ("args", key), "set the rate with optimizer.learning_rate (it is "
                                            "scaled by the world size and scheduled)")


OPTIMIZER = Map({
    "name": Field(Str(what="a keras.optimizers name"), default="adam"),
    "args": Field(AnyMap(), default={}),
    "learning_rate": Field(Float(0.0, low_open=True), default=0.001),
    "scale_by_world_size": Field(Bool(), default=True,
                                 help="multiply learning_rate by the number of ranks"),
    "warmup": Field(Nullable(WARMUP)),
    "schedule": Field(Nullable(SCHEDULE)),
    "compression": Field(Str(choices=COMPRESSIONS), default="none"),
    "backward_passes_per_step": Field(Int(1, 1 << 16), default=1),
}, what="the optimizer section", post=_check_optimizer)

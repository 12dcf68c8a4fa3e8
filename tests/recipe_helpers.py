"""Shared by the recipe tests: a `module:function` data source and model, and
a helper that runs `hvdkeras train` as a real command, and the pure
learning-rate reference the schedule tests compare against."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Dict

import numpy as np

from hvdkeras.training.lr_formulas import warmup_learning_rate
from mpi_runner import describe, run_command

HVDKERAS = Path(sys.executable).parent / "hvdkeras"


def squares_dataset(count: int = 40, rank: int = 0, size: int = 1):
    """A `module:function` data source: (x, x**2 > 0.25) for x in [0, 1)."""
    import tensorflow as tf

    x = np.linspace(0.0, 1.0, count, endpoint=False, dtype=np.float32).reshape(-1, 1)
    y = (x[:, 0] ** 2 > 0.25).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices((x, y))


def train(recipe, *overrides, np_=2, summary=None, timeout=600, cwd=None, env=None):
    """Runs `hvdkeras train RECIPE --np N --set ...`; returns (result, summary dict)."""
    command = [str(HVDKERAS), "train", str(recipe), "--np", str(np_)]
    for override in overrides:
        command += ["--set", override]
    if summary is not None:
        command += ["--summary-json", str(summary)]
    result = run_command(command, timeout=timeout, cwd=cwd, env=env)
    assert result.returncode == 0, describe(result)
    data = json.loads(Path(summary).read_text()) if summary is not None else None
    return result, data


def learning_rate_at(plan: Dict[str, Any], step: int, size: int) -> float:
    """The learning rate a recipe's plan (`hvdkeras.recipes.lr_plan`) gives at
    optimizer step `step`: the reference the tests compare the Keras
    schedules against, written from the schedules' documented formulas."""
    base, warmup = plan["base"], plan["warmup_steps"]
    if warmup and step < warmup:
        return warmup_learning_rate(step, base, warmup, size)
    t = step - warmup
    schedule = plan["schedule"]
    if schedule is None or schedule["name"] == "constant":
        return base
    name, decay = schedule["name"], plan["decay_steps"]
    if name == "cosine":
        progress = min(t, decay) / decay
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return base * ((1 - schedule["alpha"]) * cosine + schedule["alpha"])
    if name == "exponential":
        p = t / decay
        if schedule["staircase"]:
            p = math.floor(p)
        return base * schedule["decay_rate"] ** p
    if name == "inverse_time":
        p = t / decay
        if schedule["staircase"]:
            p = math.floor(p)
        return base / (1 + schedule["decay_rate"] * p)
    if name == "polynomial":
        end = base * schedule["end_multiplier"]
        p = min(t, decay) / decay
        return (base - end) * (1 - p) ** schedule["power"] + end
    if name == "piecewise":
        multipliers = schedule["multipliers"]
        for boundary, multiplier in zip(plan["boundaries"], multipliers):
            if t <= boundary:
                return base * multiplier
        return base * multipliers[-1]
    raise ValueError(f"unknown schedule {name!r}")  # pragma: no cover

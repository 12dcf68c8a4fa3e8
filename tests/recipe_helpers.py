"""Shared by the recipe tests: a `module:function` data source and model, and
a helper that runs `hvdkeras train` as a real command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

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

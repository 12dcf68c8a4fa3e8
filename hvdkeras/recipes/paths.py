"""Where a recipe's files are: inputs relative to the recipe, outputs
relative to where the run starts, "{bundled}/..." inside the package.

What may import this module: the rest of `hvdkeras.recipes` (pure Python).
"""

from __future__ import annotations

import os
from pathlib import Path as FsPath

from hvdkeras.recipes.schema_data import BUNDLED_DATA_DIR

BUNDLED_PLACEHOLDER = "{bundled}"


def expand_input_path(path: str, base: FsPath) -> str:
    """`{bundled}/x` -> the package's data dir; relative -> relative to `base`."""
    if path.startswith(BUNDLED_PLACEHOLDER):
        path = str(BUNDLED_DATA_DIR) + path[len(BUNDLED_PLACEHOLDER):]
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else str(base / path)


def _output_path(path: str, cwd: FsPath) -> str:
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else str(cwd / path)


def resolve_paths(recipe: dict, base: FsPath, cwd: FsPath) -> None:
    """Makes every path in `recipe` absolute (in place)."""
    data = recipe["data"]
    if data["path"] is not None:
        data["path"] = [expand_input_path(p, base) for p in data["path"]]
    if data["validation"] is not None and data["validation"]["path"] is not None:
        data["validation"]["path"] = [expand_input_path(p, base) for p in data["validation"]["path"]]
    if recipe["checkpoint"] is not None:
        recipe["checkpoint"]["dir"] = _output_path(recipe["checkpoint"]["dir"], cwd)
    callbacks = recipe["callbacks"]
    if callbacks["tensorboard"] is not None:
        callbacks["tensorboard"]["log_dir"] = _output_path(callbacks["tensorboard"]["log_dir"], cwd)
    if callbacks["csv_logger"] is not None:
        callbacks["csv_logger"]["path"] = _output_path(callbacks["csv_logger"]["path"], cwd)
    if recipe["engine"]["timeline"] is not None:
        recipe["engine"]["timeline"] = _output_path(recipe["engine"]["timeline"], cwd)




def run_dir_of(recipe: dict) -> str | None:
    """Where a recipe's run writes (its `run.json`, and where `hvdkeras report`
    looks): the CSV log's directory, else the checkpoint directory's parent,
    else the TensorBoard directory's parent; None when it writes none of
    them. Call after `resolve_paths`. Pure.

    >>> run_dir_of({"callbacks": {"csv_logger": {"path": "/r/d/history.csv"},
    ...             "tensorboard": None}, "checkpoint": None})
    '/r/d'
    """
    callbacks = recipe["callbacks"]
    if callbacks["csv_logger"] is not None:
        return os.path.dirname(callbacks["csv_logger"]["path"])
    if recipe["checkpoint"] is not None:
        return os.path.dirname(recipe["checkpoint"]["dir"].rstrip("/"))
    if callbacks["tensorboard"] is not None:
        return os.path.dirname(callbacks["tensorboard"]["log_dir"].rstrip("/"))
    return None

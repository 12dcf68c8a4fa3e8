"""What a run directory holds, read into plain Python. Pure (files only).

A run directory is where a recipe's outputs go (`runs/digits/` for the
bundled digits recipe): its CSV log (``history.csv``, one row per epoch),
``run.json`` (the summary rank 0 writes at the end of a run) and any engine
timeline (``*.json`` holding Chrome trace events) found there or named by
``run.json``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Dict, List

SUMMARY_NAME = "run.json"  # written by rank 0 at the end of a recipe run (recipes/training.py)
# The prefix of the figures EngineStatsCallback adds to the epoch logs
# (hvdkeras/callbacks/engine_stats.py), which readers tell from metrics by it.
ENGINE_PREFIX = "hvdkeras_"


@dataclasses.dataclass
class RunData:
    """A run directory's contents.

    Attributes:
        directory: The run directory.
        epochs: Epoch numbers (1-based), one per history row.
        history: Column name -> one value per epoch (NaN where missing).
        summary: `run.json`, or {} without one.
        timelines: Engine timeline files.
        source: Where the history came from (a file name).
    """

    directory: Path
    epochs: List[int]
    history: Dict[str, List[float]]
    summary: dict
    timelines: List[Path]
    source: str

    def metric_names(self) -> List[str]:
        """Training metrics with a curve: loss first, then the rest by name
        (validation, learning-rate and engine columns excluded)."""
        names = [k for k in self.history if not k.startswith(("val_", ENGINE_PREFIX))
                 and k not in ("learning_rate", "lr")]
        return sorted(names, key=lambda k: (k != "loss", k))


def _number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def read_history_csv(path: Path) -> tuple[List[int], Dict[str, List[float]]]:
    """(epochs, columns) of a Keras CSVLogger file; epochs there are 0-based."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "epoch" not in rows[0]:
        raise ValueError(f"{path} has no 'epoch' column: not a Keras CSV log")
    epochs = [int(float(r["epoch"])) + 1 for r in rows]
    columns = {k: [_number(r.get(k, "")) for r in rows] for k in rows[0] if k != "epoch"}
    return epochs, columns


def _history_from_summary(summary: dict) -> tuple[List[int], Dict[str, List[float]]]:
    history = summary.get("history") or {}
    length = max((len(v) for v in history.values()), default=0)
    first = int(summary.get("initial_epoch") or 0) + 1
    columns = {k: [float(x) for x in v] + [math.nan] * (length - len(v))
               for k, v in history.items()}
    return list(range(first, first + length)), columns


def is_timeline(path: Path) -> bool:
    """Whether `path` holds Chrome trace events (the engine's timeline format)."""
    try:
        with open(path) as f:
            head = f.read(4096).lstrip()
    except OSError:
        return False
    return head.startswith("[") and '"ph"' in head or head.startswith('{"traceEvents"')


def load_run(directory: Path) -> RunData:
    """Reads a run directory.

    Raises:
        FileNotFoundError: when it is not a directory.
        ValueError: when it holds no per-epoch history (no CSV log, no
            `run.json` with a history), naming what was looked for.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory")
    summary: dict = {}
    summary_path = directory / SUMMARY_NAME
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
    csv_path = None
    if summary.get("csv_log") and Path(summary["csv_log"]).is_file():
        csv_path = Path(summary["csv_log"])
    elif (directory / "history.csv").is_file():
        csv_path = directory / "history.csv"
    else:
        csv_path = next(iter(sorted(directory.glob("*.csv"))), None)
    if csv_path is not None:
        epochs, history = read_history_csv(csv_path)
        source = csv_path.name
    elif summary.get("history"):
        epochs, history = _history_from_summary(summary)
        source = SUMMARY_NAME
    else:
        raise ValueError(f"{directory} holds no per-epoch history: neither a Keras CSV log "
                         f"(history.csv) nor {SUMMARY_NAME}; set callbacks.csv_logger in the "
                         "recipe, or point at the directory it writes to")
    timelines = [p for p in sorted(directory.glob("*.json")) if p.name != SUMMARY_NAME
                 and is_timeline(p)]
    named = summary.get("timeline")
    if named and Path(named).is_file() and Path(named) not in timelines and is_timeline(Path(named)):
        timelines.append(Path(named))
    return RunData(directory, epochs, history, summary, timelines, source)


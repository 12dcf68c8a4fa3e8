"""Checkpoint file naming and selection: plain functions, no I/O.

A checkpoint directory holds `epoch-00003.keras` style files, one per saved
epoch (the number is the count of finished epochs, i.e. the `initial_epoch`
to resume with), and, with step checkpoints, `epoch-00003-step-0000040.keras`
(3 finished epochs and 40 steps of the fourth). A file's *position* is
(finished epochs, steps into the next epoch); newer means a later position.
Files are written under a temporary name starting with `.tmp-` and renamed
when complete. Anything else in the directory is ignored.

What may import this module: anything (standard library only).
"""

from __future__ import annotations

import math
import re
from typing import Iterable, List, Optional, Tuple

TEMPORARY_PREFIX = ".tmp-"
STATE_FILE = "checkpoint_state.json"
# The entry hvdkeras adds to each `.keras` archive: what decides the next step
# besides the weights and the optimizer (position, layers' random states).
# Written by checkpoint_writing.save_model_atomic, read by checkpoint_restore.
RESUME_ENTRY = "hvdkeras_resume.json"
_NAME = re.compile(r"^epoch-(\d+)(?:-step-(\d+))?\.keras$")


def checkpoint_name(epoch: int, step: int = 0) -> str:
    """File name of the checkpoint taken after `epoch` finished epochs and
    `step` steps of the next one."""
    if epoch < 0 or step < 0:
        raise ValueError(f"epoch and step must be >= 0, got {epoch} and {step}.")
    return f"epoch-{epoch:05d}-step-{step:07d}.keras" if step else f"epoch-{epoch:05d}.keras"


def parse_checkpoint_position(name: str) -> Optional[Tuple[int, int]]:
    """(finished epochs, steps into the next epoch) of a checkpoint file name, or None."""
    match = _NAME.match(name)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2) or 0)


def parse_checkpoint_name(name: str) -> Optional[int]:
    """The finished-epoch count in a checkpoint file name, or None for other files."""
    position = parse_checkpoint_position(name)
    return position[0] if position else None


def temporary_name(final_name: str, token: str) -> str:
    """The name a checkpoint is written under before the rename.

    It keeps the final suffix (Keras picks the format from it) and starts
    with `TEMPORARY_PREFIX`, so selection never mistakes it for a checkpoint.
    """
    return f"{TEMPORARY_PREFIX}{token}-{final_name}"


def is_temporary(name: str) -> bool:
    """Whether `name` is a leftover of an unfinished write."""
    return name.startswith(TEMPORARY_PREFIX)


def newest_first(names: Iterable[str]) -> List[Tuple[int, str]]:
    """(finished epochs, name) of the checkpoint files among `names`, newest
    (latest position) first."""
    found = [(parse_checkpoint_position(n), n) for n in names]
    return [(position[0], n) for position, n in sorted(
        ((p, n) for p, n in found if p is not None), reverse=True)]


def files_to_prune(names: Iterable[str], keep_last: Optional[int]) -> List[str]:
    """Checkpoint files beyond the newest `keep_last` (None keeps all)."""
    if keep_last is None:
        return []
    return [n for _, n in newest_first(names)[keep_last:]]


def resolve_mode(mode: str, monitor: str) -> str:
    """"min" or "max" for a monitored metric; "auto" guesses from its name."""
    if mode in ("min", "max"):
        return mode
    if mode != "auto":
        raise ValueError(f"mode must be 'auto', 'min' or 'max', got {mode!r}.")
    name = monitor.lower()
    higher_is_better = ("acc", "auc", "precision", "recall", "f1", "iou")
    return "max" if any(word in name for word in higher_is_better) else "min"


def improved(value: float, best: Optional[float], mode: str) -> bool:
    """Whether `value` beats `best` (None: nothing yet; NaN never improves)."""
    if value is None or math.isnan(value):
        return False
    if best is None:
        return True
    return value < best if mode == "min" else value > best

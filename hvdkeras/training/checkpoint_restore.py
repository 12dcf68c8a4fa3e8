"""Resuming every rank from the newest complete checkpoint of a directory.

What may import this module: the top-level package and the recipes' training
code.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any, Optional, Tuple

import numpy as np
import tensorflow as tf

from hvdkeras.collectives.broadcasting import broadcast
from hvdkeras.engine import world
from hvdkeras.training.checkpoint_naming import newest_first
from hvdkeras.training.model_sync import broadcast_model, build_optimizer


def is_complete_archive(path: str) -> bool:
    """Whether `path` is a readable `.keras` archive holding weights."""
    try:
        with zipfile.ZipFile(path) as archive:
            if archive.testzip() is not None:
                return False
            return "model.weights.h5" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _load_newest(model: Any, directory: str) -> Tuple[int, Optional[str]]:
    """On the root: loads the newest complete checkpoint. (epoch, path or None)."""
    if not os.path.isdir(directory):
        return 0, None
    for epoch, name in newest_first(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not is_complete_archive(path):
            print(f"hvdkeras: skipping incomplete checkpoint {path}.", flush=True)
            continue
        model.load_weights(path)
        return epoch, path
    return 0, None


def restore_from_checkpoint(model: Any, directory: str, root_rank: int = 0,
                            verbose: int = 1) -> int:
    """Resumes training: loads the newest checkpoint and syncs every rank.

    The root rank loads the newest complete checkpoint of `directory` (as
    written by `hvdkeras.callbacks.CheckpointCallback`) into `model`: weights
    and optimizer state (slots, iteration count, learning rate). Then every
    rank receives the root's state, so all continue from identical weights
    and optimizer state, even without a shared filesystem. Without a
    checkpoint the root's current state is broadcast and 0 returned. Call it
    on every rank, after `compile()`.

    Args:
        model: The compiled, built model (same architecture as saved).
        directory: The checkpoint directory (read on the root rank only).
        root_rank: The rank that reads the file.
        verbose: 1 prints which checkpoint was loaded (on rank 0).

    Returns:
        The number of finished epochs in the checkpoint: pass it to
        `fit(initial_epoch=...)`.

    Raises:
        RuntimeError: on every rank, if the root could not load the newest
            complete checkpoint (the root also shows the cause).

    Example:

    ```python
    initial_epoch = hvd.restore_from_checkpoint(model, "checkpoints")
    model.fit(x, y, epochs=10, initial_epoch=initial_epoch, callbacks=[
        *hvd.callbacks.standard_callbacks(checkpoint_dir="checkpoints")])
    ```
    """
    if not getattr(model, "built", False) or getattr(model, "optimizer", None) is None:
        raise ValueError(
            "restore_from_checkpoint needs a built, compiled model: create it with a "
            "keras.Input (or call model.build()), then model.compile(...), then restore."
        )
    build_optimizer(model)
    epoch, path, failure = 0, None, None
    if world.rank() == root_rank:
        try:
            epoch, path = _load_newest(model, directory)
        except Exception as error:  # reported on every rank below
            failure = error
    status = np.array([epoch, 0 if failure is None else 1], dtype=np.int64)
    status = broadcast(tf.constant(status), root_rank=root_rank,
                       name="hvdkeras_restore_status").numpy()
    if status[1]:
        message = (f"Rank {root_rank} could not load the newest checkpoint in {directory!r}; "
                   "fix or remove that file (older ones are kept) and restart.")
        if failure is not None:
            raise RuntimeError(f"{message} Cause: {failure}") from failure
        raise RuntimeError(message)
    broadcast_model(model, root_rank=root_rank)
    epoch = int(status[0])
    if verbose and world.rank() == root_rank:
        if path is not None:
            print(f"hvdkeras: resumed from {path}: continuing at epoch {epoch + 1}.", flush=True)
        else:
            print(f"hvdkeras: no checkpoint in {directory!r}: starting at epoch 1.", flush=True)
    return epoch

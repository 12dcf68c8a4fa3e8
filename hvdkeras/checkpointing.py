"""Atomic checkpoint writes and resuming every rank from the newest one."""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any, Optional, Tuple

import numpy as np
import tensorflow as tf

from hvdkeras import basics
from hvdkeras.checkpoint_files import newest_first, temporary_name
from hvdkeras.collectives import broadcast
from hvdkeras.model_sync import broadcast_model, build_optimizer


def _fsync_directory(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(temporary: str, path: str) -> None:
    """fsyncs `temporary`, renames it onto `path`, fsyncs the directory."""
    with open(temporary, "rb") as f:
        os.fsync(f.fileno())
    os.replace(temporary, path)
    _fsync_directory(os.path.dirname(os.path.abspath(path)))


def save_model_atomic(model: Any, path: str) -> None:
    """`model.save(path)` that never leaves a partial file at `path`.

    The model is written to a temporary file in the same directory (same
    filesystem, same `.keras` suffix), flushed to disk and renamed onto
    `path`: a reader sees the previous file or the new one, never half of one.

    Args:
        model: The Keras model to save (with its optimizer state).
        path: The final `.keras` path.
    """
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, temporary_name(name, str(os.getpid())))
    try:
        model.save(temporary)
        _publish(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def write_json_atomic(path: str, data: Any) -> None:
    """Writes `data` as JSON to `path` through a temporary file and a rename."""
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, temporary_name(name, str(os.getpid())))
    try:
        with open(temporary, "w") as f:
            json.dump(data, f)
        _publish(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


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
    if basics.rank() == root_rank:
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
    if verbose and basics.rank() == root_rank:
        if path is not None:
            print(f"hvdkeras: resumed from {path}: continuing at epoch {epoch + 1}.", flush=True)
        else:
            print(f"hvdkeras: no checkpoint in {directory!r}: starting at epoch 1.", flush=True)
    return epoch

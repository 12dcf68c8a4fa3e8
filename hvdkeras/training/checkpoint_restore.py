"""Resuming every rank from the newest complete checkpoint of a directory.

What may import this module: the top-level package and the recipes' training
code.
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np

from hvdkeras.engine import world
from hvdkeras.host import arrays
from hvdkeras.training.checkpoint_naming import (RESUME_ENTRY, newest_first,
                                                 parse_checkpoint_position)
from hvdkeras.training.model_sync import broadcast_model, build_optimizer
from hvdkeras.sharding.sharded_optimizer import shard_holder
from hvdkeras.sharding.state_transfer import (scatter_from_root, share_weights_from,
                                              whole_weights)
from hvdkeras.training.resume_state import apply_random_states


class TrainingPosition(NamedTuple):
    """Where a resumed run continues: finished epochs, and steps of the next epoch.

    `world_size` and `steps_per_epoch` describe the run that saved the
    checkpoint (0 when unknown: no checkpoint, or one from an older hvdkeras);
    an elastic restart may resume on another world size.
    """

    epoch: int
    step: int
    world_size: int = 0
    steps_per_epoch: int = 0


def is_complete_archive(path: str) -> bool:
    """Whether `path` is a readable `.keras` archive holding weights."""
    try:
        with zipfile.ZipFile(path) as archive:
            if archive.testzip() is not None:
                return False
            return "model.weights.h5" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


def _read_resume_state(path: str) -> Optional[dict]:
    try:
        with zipfile.ZipFile(path) as archive:
            if RESUME_ENTRY not in archive.namelist():
                return None  # written before checkpoints carried it
            return json.loads(archive.read(RESUME_ENTRY))
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


def _load_newest(model: Any, directory: str) -> Tuple[TrainingPosition, Optional[str]]:
    """On the root: loads the newest complete checkpoint. (position, path or None)."""
    if not os.path.isdir(directory):
        return TrainingPosition(0, 0), None
    for _, name in newest_first(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not is_complete_archive(path):
            print(f"hvdkeras: skipping incomplete checkpoint {path}.", flush=True)
            continue
        model.load_weights(path)
        state = _read_resume_state(path)
        if state is not None and not apply_random_states(model, state):
            print(f"hvdkeras: {path} holds random-generator states for another model; the "
                  "layers keep fresh ones, so random draws differ from an uninterrupted run.",
                  flush=True)
        epoch, step = parse_checkpoint_position(name)
        state = state or {}
        return TrainingPosition(epoch, step, int(state.get("world_size") or 0),
                                int(state.get("steps_per_epoch") or 0)), path
    return TrainingPosition(0, 0), None


def restore_from_checkpoint(model: Any, directory: str, root_rank: int = 0,
                            verbose: int = 1) -> int:
    """Resumes training at an epoch start; see `restore_training_position`.

    Returns the finished epochs of the newest checkpoint, for
    `fit(initial_epoch=...)`. A mid-epoch checkpoint (written with
    `CheckpointCallback(every_steps=...)`) counts as its finished epochs:
    use `restore_training_position` to continue at its step instead.

    Example:

    ```python
    initial_epoch = hvd.restore_from_checkpoint(model, "checkpoints")
    model.fit(x, y, epochs=10, initial_epoch=initial_epoch, callbacks=[
        *hvd.callbacks.standard_callbacks(checkpoint_dir="checkpoints")])
    ```
    """
    return restore_training_position(model, directory, root_rank, verbose).epoch


def restore_training_position(model: Any, directory: str, root_rank: int = 0,
                              verbose: int = 1) -> TrainingPosition:
    """Resumes training: loads the newest checkpoint and syncs every rank.

    The root rank loads the newest complete checkpoint of `directory` (as
    written by `hvdkeras.callbacks.CheckpointCallback`) into `model`: weights
    and optimizer state (slots, iteration count, learning rate). Then every
    rank receives the root's state, so all continue from identical weights
    and optimizer state, even without a shared filesystem. Without a
    checkpoint the root's current state is broadcast and (0, 0) returned.
    The layers' random-generator states saved with the checkpoint are
    restored too (see Note [exact resume] in resume_state.py). With a sharded
    optimizer (`zero_stage` 1 to 3) the root sends each rank the slots of
    the variables it owns, whatever the number of ranks that wrote the file.
    Call it on every rank, after `compile()`.

    Args:
        model: The compiled, built model (same architecture as saved).
        directory: The checkpoint directory (read on the root rank only).
        root_rank: The rank that reads the file.
        verbose: 1 prints which checkpoint was loaded (on rank 0).

    Returns:
        A `TrainingPosition(epoch, step)`: the finished epochs (pass them to
        `fit(initial_epoch=...)`) and the steps of the next epoch the
        checkpoint already includes (0 at an epoch end).

    Raises:
        RuntimeError: on every rank, if the root could not load the newest
            complete checkpoint (the root also shows the cause).

    Example:

    ```python
    position = hvd.restore_training_position(model, "checkpoints")
    print(position.epoch, position.step)
    ```
    """
    if not getattr(model, "built", False) or getattr(model, "optimizer", None) is None:
        raise ValueError(
            "restore_from_checkpoint needs a built, compiled model: create it with a "
            "keras.Input (or call model.build()), then model.compile(...), then restore."
        )
    build_optimizer(model)
    holder = shard_holder(model.optimizer)
    if holder is not None and root_rank != 0:
        raise ValueError("A sharded optimizer (zero_stage 1 to 3) is restored through rank 0; "
                         "call restore_training_position with root_rank=0.")
    with whole_weights(model):  # zero_stage=3: the root loads whole weights
        position, path, status = _load_on_root(model, directory, root_rank, holder)
    if holder is not None:
        scatter_from_root(holder)
    position = TrainingPosition(*(int(v) for v in status[:4]))
    if verbose and world.rank() == root_rank:
        if path is not None:
            at = f" step {position.step + 1}" if position.step else ""
            print(f"hvdkeras: resumed from {path}: continuing at epoch {position.epoch + 1}{at}.",
                  flush=True)
        else:
            print(f"hvdkeras: no checkpoint in {directory!r}: starting at epoch 1.", flush=True)
    return position


def _load_on_root(model: Any, directory: str, root_rank: int, holder: Any):
    """The root loads the newest checkpoint and every rank takes its weights."""
    position, path, failure = TrainingPosition(0, 0), None, None
    if world.rank() == root_rank:
        if holder is not None:  # keep the other ranks' slots to send them after
            holder._hvdkeras_shards.collecting = True
        try:
            position, path = _load_newest(model, directory)
        except Exception as error:  # reported on every rank below
            failure = error
    status = np.array([*position, 0 if failure is None else 1], dtype=np.int64)
    status, = arrays.grouped_broadcast([status], root_rank, "hvdkeras_restore_status")
    if status[4]:
        message = (f"Rank {root_rank} could not load the newest checkpoint in {directory!r}; "
                   "fix or remove that file (older ones are kept) and restart.")
        if failure is not None:
            raise RuntimeError(f"{message} Cause: {failure}") from failure
        raise RuntimeError(message)
    broadcast_model(model, root_rank=root_rank)
    share_weights_from(model, root_rank)  # zero_stage=3's sharded weights
    return position, path, status

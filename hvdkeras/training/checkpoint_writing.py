"""Atomic file writes: checkpoints and their JSON state, written under a
temporary name in the same directory, flushed and renamed, so a reader sees
the previous file or the new one, never half of one.

What may import this module: the rest of `hvdkeras.training`, the callbacks
and the top-level package.
"""

from __future__ import annotations

import json
import os
import zipfile
from typing import Any, Optional

from hvdkeras.training.checkpoint_naming import RESUME_ENTRY, temporary_name


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


def save_model_atomic(model: Any, path: str, resume_state: Optional[dict] = None) -> None:
    """`model.save(path)` that never leaves a partial file at `path`.

    The model is written to a temporary file in the same directory (same
    filesystem, same `.keras` suffix), flushed to disk and renamed onto
    `path`: a reader sees the previous file or the new one, never half of one.

    Args:
        model: The Keras model to save (with its optimizer state).
        path: The final `.keras` path.
        resume_state: Added to the archive as `RESUME_ENTRY` (JSON) before
            the rename, so the file and its state appear together. Keras
            ignores the entry when it loads the file.
    """
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, temporary_name(name, str(os.getpid())))
    try:
        model.save(temporary)
        if resume_state is not None:
            with zipfile.ZipFile(temporary, "a") as archive:
                archive.writestr(RESUME_ENTRY, json.dumps(resume_state))
        _publish(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise


def write_json_atomic(path: str, data: Any) -> None:
    """Writes `data` as JSON to `path` through a temporary file and a rename."""
    write_bytes_atomic(path, json.dumps(data).encode())


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file and a rename."""
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, temporary_name(name, str(os.getpid())))
    try:
        with open(temporary, "wb") as f:
            f.write(data)
        _publish(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise

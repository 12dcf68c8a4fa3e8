"""Files and records shared by the function runners and their rank entry points."""

from __future__ import annotations

import os
import pickle
import time

import cloudpickle

TASK_FILE = "task.pkl"


def result_path(task_dir: str, rank: int) -> str:
    return os.path.join(task_dir, f"result.{rank}.pkl")


def error_path(task_dir: str, rank: int) -> str:
    return os.path.join(task_dir, f"error.{rank}.pkl")


def write_atomic(path: str, data: bytes) -> None:
    """Writes `data` to `path` so that readers see all of it or nothing."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def error_record(rank: int, exc: BaseException, formatted: str) -> dict:
    """What the caller needs to re-raise a rank's exception.

    Keys: rank, type, message, traceback (formatted), time, and exception
    (the cloudpickled exception, or None when it does not round-trip).
    """
    record = {"rank": rank, "type": type(exc).__name__, "message": str(exc),
              "traceback": formatted, "time": time.time(), "exception": None}
    try:
        blob = cloudpickle.dumps(exc)
        pickle.loads(blob)
        record["exception"] = blob
    except Exception:  # an exception that does not pickle: keep its text
        pass
    return record

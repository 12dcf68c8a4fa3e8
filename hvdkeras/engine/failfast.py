"""Ending the whole job when one rank fails: MPI abort instead of finalize.

Note [abort, not finalize]
~~~~~~~~~~~~~~~~~~~~~~~~~~
A rank that leaves with an uncaught exception runs Python's exit handlers,
and mpi4py's handler calls `MPI_Finalize`, which waits for every other rank
to finalize too. While another rank is busy outside a collective (a long
epoch, a validation pass) the failed rank therefore neither ends nor reports,
and the launcher learns of the failure only when the whole job ends. So once
`init()` has run in a world of more than one rank, an uncaught exception
prints its traceback as usual and then calls `MPI_Abort`: the MPI launcher
ends every rank at once, and the failed rank's exit code and last lines reach
`hvdkerasrun`, which names it. A collective that fails because of another
rank (stall shutdown, engine error) raises on the ranks that wait in it, so it
ends the job the same way. The places relying on this: `world.init()`
installs the hook, `recipes.run` ends the job through `end_job` when it exits
with an error, and `tests/test_fault_ending.py` checks the bound.

`HVDKERAS_ABORT_ON_ERROR=0` turns this off (a rank's exception then waits in
`MPI_Finalize` for the others, as plain mpi4py does).

What may import this module: `hvdkeras.engine.world` and layers above it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import stat
import struct
import sys
import termios
import time
import traceback
from types import TracebackType
from typing import Callable, Mapping, Optional

from hvdkeras.engine.config import ABORT_ON_ERROR, parse_bool

# Where `hvdkerasrun`'s per-rank shim wants this rank's failure record; the
# format is Note [failure record] in hvdkeras/runner/rank_shim.py.
FAILURE_RECORD_ENV = "HVDKERAS_FAILURE_RECORD"
RECORD_LINES = 20

# Before the abort: how long a failing rank waits, at most, for the readers of
# its output pipes to take its last lines, and how long it then gives them to
# pass the lines on.
DRAIN_LIMIT_S = 2.0
DRAIN_GRACE_S = 0.1

# Exit codes the aborting rank reports: 130 is what a shell shows for Ctrl-C.
EXCEPTION_EXIT_CODE = 1
INTERRUPT_EXIT_CODE = 130

# How a rank's collective fails after *another* rank shut the engine down or
# exited: such a rank is a casualty, not the cause.
# See Note [shutdown wording] in ops/core/engine.cc.
_CASUALTY = re.compile(r"hvdkeras (has been|was) shut down")

_abort: Optional[Callable[[int], None]] = None
_rank = 0
_previous_hook = None


def enabled(size: int, env: Mapping[str, str] = os.environ) -> bool:
    """Whether a failing rank of a `size`-rank world should end the job. Pure."""
    return size > 1 and parse_bool(env, ABORT_ON_ERROR, default=True)


def is_casualty(text: str) -> bool:
    """Whether `text` (a rank's last lines or traceback) shows it failed because another rank left."""
    return bool(_CASUALTY.search(text or ""))


def exit_code_for(exc_type: type) -> int:
    """The exit code an uncaught exception of `exc_type` ends the job with. Pure."""
    return INTERRUPT_EXIT_CODE if issubclass(exc_type, KeyboardInterrupt) else EXCEPTION_EXIT_CODE


def install(abort: Callable[[int], None], rank: int, size: int) -> None:
    """Makes an uncaught exception end the job through `abort(exit_code)`.

    Args:
        abort: Ends every rank of the job with the given exit code
            (`MPI.Comm.Abort`).
        rank: This process's rank, for the message.
        size: The world's size; nothing is installed for one rank or when
            `HVDKERAS_ABORT_ON_ERROR=0`.
    """
    global _abort, _rank, _previous_hook
    if not enabled(size):
        return
    _abort, _rank = abort, rank
    if _previous_hook is None:
        _previous_hook = sys.excepthook
        sys.excepthook = _hook


def uninstall() -> None:
    """Restores the previous exception hook (after `shutdown()`)."""
    global _abort, _previous_hook
    _abort = None
    if _previous_hook is not None and sys.excepthook is _hook:
        sys.excepthook = _previous_hook
    _previous_hook = None


def _hook(exc_type: type, exc: BaseException, tb: Optional[TracebackType]) -> None:
    previous = _previous_hook or sys.__excepthook__
    try:
        previous(exc_type, exc, tb)
    except Exception:  # a broken user hook must not stop the abort
        traceback.print_exception(exc_type, exc, tb)
    if _abort is None or is_casualty(str(exc)):
        # A casualty exits as usual: the rank that left is already ending the
        # job, finalizes with this one and reports its own failure.
        return
    lines = "".join(traceback.format_exception(exc_type, exc, tb)).splitlines()
    end_job(exit_code_for(exc_type), f"an uncaught {exc_type.__name__}", lines)


def failure_record(rank: int, exit_code: int, reason: str, lines: list[str]) -> dict:
    """This rank's failure record (Note [failure record]). Pure but for the clock and host."""
    return {"rank": str(rank), "attempt": int(os.environ.get("HVDKERAS_ATTEMPT", "1") or 1),
            "exit_code": exit_code, "signal": None, "last_lines": lines[-RECORD_LINES:],
            "time": time.time(), "host": socket.gethostname(), "pid": os.getpid(),
            "reason": reason}


def _write_record(record: dict) -> None:
    """Atomically writes `record` where the launcher's shim asked, if it asked."""
    path = os.environ.get(FAILURE_RECORD_ENV, "")
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError as exc:
        sys.stderr.write(f"hvdkeras: cannot write the failure record {path}: {exc}\n")


def end_job(exit_code: int, reason: str, lines: Optional[list[str]] = None) -> None:
    """Ends every rank of the job now with `exit_code`, saying why (on stderr).

    Does nothing when no abort is installed (one rank, or turned off): the
    caller then exits as usual.

    Args:
        exit_code: The exit code the job ends with.
        reason: What failed, e.g. "an uncaught ValueError".
        lines: The last lines to report for this rank (e.g. its traceback).
    """
    if _abort is None:
        return
    _write_record(failure_record(_rank, exit_code, reason, list(lines or [reason])))
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    try:
        sys.stderr.write(f"hvdkeras: rank {_rank} failed with {reason}; ending the whole job "
                         f"(MPI abort, exit code {exit_code}). HVDKERAS_ABORT_ON_ERROR=0 "
                         "waits for the other ranks instead.\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    wait_for_readers()
    _abort(exit_code)


def wait_for_readers(limit_s: float = DRAIN_LIMIT_S) -> bool:
    """Waits, at most `limit_s`, until whoever reads this process's stdout and
    stderr pipes (hvdkerasrun's rank shim, or mpiexec) has taken everything
    written to them; returns whether it did. Streams that are not pipes
    (a terminal, a file) need no wait.

    The abort kills the readers together with this rank: without the wait,
    the last lines a failing rank printed (often the ones saying why) could
    be lost in a pipe on a busy machine.
    """
    deadline = time.monotonic() + limit_s
    for fd in (1, 2):
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                continue
            while struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0] > 0:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.005)
        except OSError:
            continue
    time.sleep(DRAIN_GRACE_S)  # the reader passes on what it took
    return True

"""Launches Python under ``mpiexec`` (or plainly) for the multi-rank tests.

Every job runs in its own process group (session), so a timeout can kill
``mpiexec``, its proxies and every rank at once instead of leaving orphans
that hold the machine or the MPI ports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

# How much of the combined output an AssertionError quotes.
TAIL_CHARS = 12_000


def tail(text: Optional[str], limit: int = TAIL_CHARS) -> str:
    """The last `limit` characters of `text`, marked when cut."""
    text = text or ""
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} characters cut ...]\n" + text[-limit:]


def mpiexec_path() -> Path:
    """The `mpiexec` next to the running interpreter (the venv's `mpich` wheel)."""
    # Deliberately not resolved: a venv's python is often a symlink to the base
    # interpreter, and the base interpreter's directory has no mpiexec.
    return Path(sys.executable).parent / "mpiexec"


def _child_env(env: Optional[Mapping[str, str]]) -> dict:
    full = dict(os.environ)
    full["TF_CPP_MIN_LOG_LEVEL"] = "2"
    full["PYTHONUNBUFFERED"] = "1"
    full.update(env or {})
    return full


def _kill_group(proc: subprocess.Popen) -> None:
    """Kills the whole process group led by `proc` (SIGTERM, then SIGKILL)."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            # The leader is gone; make sure nothing else in the group survives.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(cmd: Sequence[str], timeout: float = 240,
                env: Optional[Mapping[str, str]] = None,
                cwd: Optional[os.PathLike] = None) -> subprocess.CompletedProcess:
    """Runs `cmd` in a new session, capturing stdout and stderr together.

    On timeout the whole process group is killed and an AssertionError with
    the tail of the output is raised.
    """
    cmd = [str(c) for c in cmd]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        text=True, errors="replace", env=_child_env(env), cwd=cwd, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            output, _ = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # a grandchild outside the group holds the pipe
            output = "(output unavailable: the pipe stayed open after the kill)"
        raise AssertionError(
            f"timed out after {timeout:g}s (process group killed): {' '.join(cmd)}\n"
            f"--- output tail ---\n{tail(output)}"
        ) from None
    except BaseException:  # e.g. KeyboardInterrupt or pytest-timeout: leave no orphans
        _kill_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, output, None)


def run_under_mpi(np: int, args: list[str], timeout: float = 240,
                  env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs ``mpiexec -n np <this python> *args``; stdout holds stdout+stderr.

    Sets HVDKERAS_EXPECTED_SIZE=np (unless `env` says otherwise), so that
    hvdkeras.init() fails loudly if the ranks come up as separate worlds of
    size 1 (a launcher/MPI mismatch) instead of passing every test np times.
    Raises AssertionError (with the output tail) when it runs past `timeout`.
    """
    cmd = [mpiexec_path(), "-n", str(np), sys.executable, *args]
    return run_command(cmd, timeout=timeout, env={"HVDKERAS_EXPECTED_SIZE": str(np), **(env or {})})


def run_python(args: list[str], timeout: float = 240,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs ``<this python> *args`` without mpiexec, like `run_under_mpi`."""
    return run_command([sys.executable, *args], timeout=timeout, env=env)


def describe(result: subprocess.CompletedProcess) -> str:
    """A failure message: the command, its exit status and its output tail."""
    return (f"exit status {result.returncode}: {' '.join(map(str, result.args))}\n"
            f"--- output tail ---\n{tail(result.stdout)}")

"""One attempt of a job: mpiexec started in a session of its own, its output
forwarded (keeping each rank's last lines), and its ranks ended when one
fails (mpiexec is given a grace period to do it itself) or the job runs
past its deadline.

What may import this module: the rest of `hvdkeras.runner` (standard
library only).
"""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, TextIO

from hvdkeras.runner import rank_shim

# After a rank fails, how long mpiexec may take to end the others before the
# launcher kills its whole process group (then SIGKILL after KILL_GRACE_S).
FAILFAST_GRACE_S = 10.0
FAILFAST_GRACE_ENV = "HVDKERAS_FAILFAST_GRACE_SECONDS"
KILL_GRACE_S = 3.0
POLL_S = 0.2
# How long a failed attempt without records waits for killed supervisors'
# witnesses to write theirs: until none has come for LOST_SETTLE_S, at most
# LOST_WAIT_S.
LOST_SETTLE_S = 0.5
LOST_WAIT_S = 3.0
# The per-rank wrapper every rank runs under mpiexec (by path: see rank_shim).
SHIM = str(Path(rank_shim.__file__).resolve())
_PREFIX = re.compile(r"^\[(\d+)\]<(?:stdout|stderr)>: ")


class _Forwarder(threading.Thread):
    """Copies mpiexec's stdout or stderr to ours as it comes, keeping each
    rank's last lines.

    Bytes pass through unchanged, so a rank's carriage-return progress
    updates reach the terminal live and intact (see rank_shim.Pump); the
    kept lines are what each line shows when it ends (rank_shim.final_state).
    """

    def __init__(self, stream, sink: Callable[[], TextIO], tails: dict, lock) -> None:
        super().__init__(daemon=True)
        self.stream, self.sink, self.tails, self.lock = stream, sink, tails, lock

    def _keep(self, line: bytes) -> None:
        text = rank_shim.final_state(line).decode(errors="replace")
        match = _PREFIX.match(text)
        key = match.group(1) if match else "mpiexec"
        with self.lock:
            self.tails.setdefault(key, collections.deque(maxlen=rank_shim.TAIL_LINES)).append(text)

    def _write(self, chunk: bytes) -> None:
        try:
            out = self.sink()
            binary = getattr(out, "buffer", None)
            if binary is not None:
                binary.write(chunk)
                binary.flush()
            else:
                out.write(chunk.decode(errors="replace"))
                out.flush()
        except (OSError, ValueError):
            pass

    def run(self) -> None:
        fd = self.stream.fileno()
        pending = b""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            self._write(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._keep(line)
        if pending:
            self._keep(pending)
        self.stream.close()


def kill_group(proc: subprocess.Popen, sig: int) -> None:
    """Sends `sig` to the process group `proc` leads (nothing if it is gone)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Attempt:
    """Runs mpiexec once and supervises it."""

    def __init__(self, cmd: list[str], env: dict, status_dir: str,
                 deadline: Optional[float] = None) -> None:
        self.cmd, self.env, self.status_dir, self.deadline = cmd, env, status_dir, deadline
        self.tails: dict = {}
        self.lost: list[dict] = []
        self.started: list[dict] = []  # marks of shims that never finished (no records only)
        self.lock = threading.Lock()
        self.enforced = False
        self.timed_out = False
        self.grace = float(env.get(FAILFAST_GRACE_ENV) or FAILFAST_GRACE_S)

    def run(self) -> tuple[int, list[dict], float, dict]:
        """(mpiexec exit code, failure records, seconds from the first failure to the end,
        last lines per rank). `lost` then holds the records of supervisors that were killed
        (rank_shim.read_lost), earliest first."""
        # mpiexec runs in a session of its own (a Ctrl-C reaches the ranks through
        # us, once), so the terminal cannot end it when the launcher dies: Linux
        # sends it SIGTERM then, and it ends its proxies and ranks, whose shims
        # also stop when their proxy dies (rank_shim.run).
        proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, bufsize=0,
                                env=self.env, start_new_session=True,
                                preexec_fn=lambda: rank_shim.die_with_parent(signal.SIGTERM))
        forwarders = [_Forwarder(proc.stdout, lambda: sys.stdout, self.tails, self.lock),
                      _Forwarder(proc.stderr, lambda: sys.stderr, self.tails, self.lock)]
        for f in forwarders:
            f.start()
        failed_at = None
        killed_at = None
        try:
            while True:
                try:
                    proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if failed_at is None and rank_shim.read_statuses(self.status_dir):
                    failed_at = now
                if failed_at is not None and killed_at is None and now - failed_at > self.grace:
                    # mpiexec did not end the other ranks in time: do it ourselves.
                    self.enforced = True
                    killed_at = now
                    kill_group(proc, signal.SIGTERM)
                if self.deadline is not None and now > self.deadline and killed_at is None:
                    self.timed_out = True
                    killed_at = now
                    kill_group(proc, signal.SIGTERM)
                if killed_at is not None and now - killed_at > KILL_GRACE_S:
                    kill_group(proc, signal.SIGKILL)
        except BaseException:
            kill_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            kill_group(proc, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            # Nothing of this attempt may outlive it (orphaned proxies or ranks).
            kill_group(proc, signal.SIGKILL)
            for f in forwarders:
                f.join(timeout=5.0)
        records = rank_shim.read_statuses(self.status_dir)
        self.lost = rank_shim.read_lost(self.status_dir)
        if not records and proc.returncode != 0:
            # Killed supervisors' witnesses may still be writing their records:
            # wait for the first, then until no more come for LOST_SETTLE_S
            # (a rank with none at all was lost with its host: failures.py).
            end = time.monotonic() + LOST_WAIT_S
            settled_at = time.monotonic() + LOST_SETTLE_S
            while time.monotonic() < end and (not self.lost or time.monotonic() < settled_at):
                time.sleep(0.05)
                found = rank_shim.read_lost(self.status_dir)
                if len(found) != len(self.lost):
                    self.lost, settled_at = found, time.monotonic() + LOST_SETTLE_S
        self.started = rank_shim.read_started(self.status_dir) if not records else []
        # Wall-clock time from the first rank's failure until everything ended.
        elapsed = max(0.0, time.time() - records[0].get("time", time.time())) if records else 0.0
        return proc.returncode, records, elapsed, self.tails

"""Per-rank wrapper that `hvdkerasrun` starts under mpiexec (stdlib only).

    python rank_shim.py --status-dir D [--log-dir L] [--attempt N] [--no-prefix] -- CMD ARGS...

It runs CMD as a child (which dies with the shim: PR_SET_PDEATHSIG), prefixes
every line the child prints with ``[rank]<stdout>: `` / ``[rank]<stderr>: ``,
optionally appends the same lines to ``L/rank.<rank>.log``, keeps the last
lines, and exits with the child's exit code (128 + N for signal N). When the
child fails on its own (not because the shim was told to stop), it writes
``D/rank.<rank>.json`` (rank, exit code or signal, last lines, time) for the
launcher to name the failing rank.

A rank that ends the job itself (an uncaught exception: MPI abort) is killed
by the MPI launcher together with its shim, so it writes its own record first,
to the path the shim hands it in ``HVDKERAS_FAILURE_RECORD``; see Note
[failure record].

The launcher runs this file by path, not with ``-m``, so that starting a
rank does not import the hvdkeras package (and TensorFlow) twice.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Optional

if __package__:
    from hvdkeras.runner import startup_noise
else:  # run by path (see above): the sibling module, without the package
    import startup_noise

TAIL_LINES = 20
# Note [failure record]
# ~~~~~~~~~~~~~~~~~~~~~
# One JSON object per failed rank in the status directory, ``rank.<R>.json``:
# rank, attempt, exit_code (None when killed by a signal), signal (its name or
# None), last_lines (up to TAIL_LINES), time (time.time() of the failure),
# host, pid and, when the rank wrote it itself, reason; the engine's watchdog
# adds silent_ranks, the ranks that did not answer it (the launcher counts
# their hosts as the failed ones when it resizes an elastic job), and the
# watchdog of a rank that found its own host cut off from rank 0's sets
# cut_off (Note [host liveness] in ops/core/liveness.h). Written atomically by
# this shim when its child fails, or by the rank itself before it aborts the
# job (hvdkeras/engine/failfast.py, which cannot import this module: it lies
# below the runner); read by the launcher (read_statuses, failures.py).
# tests/test_fault_ending.py checks that a record failfast writes reads back here.
FAILURE_RECORD_ENV = "HVDKERAS_FAILURE_RECORD"
STATUS_PREFIX = "rank."
STATUS_SUFFIX = ".json"
_PR_SET_PDEATHSIG = 1
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
              signal.SIGUSR2)
_KILL_GRACE_S = 10.0


def rank_from_env(environ=os.environ) -> str:
    """This process's rank as the MPI launcher announced it ("?" if none did)."""
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_RANK", "SLURM_PROCID"):
        value = environ.get(name, "").strip()
        if value.isdigit():
            return value
    return "?"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def status_path(status_dir: str, rank: str) -> str:
    return os.path.join(status_dir, f"{STATUS_PREFIX}{rank}{STATUS_SUFFIX}")


# A supervisor killed outright (SIGKILL) cannot say so, and the MPI launcher
# then kills the other ranks' supervisors too. So each shim starts a small
# witness process, in a session of its own, that waits on a pipe: when the
# shim finishes it writes one byte; when it dies the pipe just closes, and the
# witness writes ``lost.<R>.json`` (rank, host, pid of the shim, time). The
# earliest such record is the supervisor that was killed first.
LOST_PREFIX = "lost."


def lost_path(status_dir: str, rank: str) -> str:
    return os.path.join(status_dir, f"{LOST_PREFIX}{rank}{STATUS_SUFFIX}")


STARTED_PREFIX = "started."


def started_path(status_dir: str, rank: str) -> str:
    """A running shim's mark (removed when it finishes): one that stays with
    neither a failure record nor a lost mark beside it is a rank whose shim
    and witness died together, the host's processes all at once."""
    return os.path.join(status_dir, f"{STARTED_PREFIX}{rank}{STATUS_SUFFIX}")


def read_started(status_dir: str) -> list[dict]:
    """Marks of shims that started and have not finished, earliest first."""
    return _read_records(status_dir, STARTED_PREFIX)


def read_lost(status_dir: str) -> list[dict]:
    """Records of supervisors that died without finishing, earliest first."""
    return _read_records(status_dir, LOST_PREFIX)


def write_status(status_dir: str, record: dict, final: Optional[str] = None) -> None:
    """Writes one rank's failure record (or another record to `final`) atomically."""
    os.makedirs(status_dir, exist_ok=True)
    final = final or status_path(status_dir, str(record["rank"]))
    tmp = f"{final}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, final)


def read_statuses(status_dir: str) -> list[dict]:
    """All failure records in `status_dir`, earliest first."""
    return _read_records(status_dir, STATUS_PREFIX)


def _read_records(status_dir: str, prefix: str) -> list[dict]:
    records = []
    try:
        names = os.listdir(status_dir)
    except OSError:
        return []
    for name in names:
        if name.startswith(prefix) and name.endswith(STATUS_SUFFIX):
            try:
                with open(os.path.join(status_dir, name), encoding="utf-8") as f:
                    records.append(json.load(f))
            except (OSError, ValueError):
                continue
    return sorted(records, key=lambda r: r.get("time", 0.0))


def final_state(line: bytes) -> bytes:
    """What a terminal shows of a line after its carriage returns: the text
    after the last one (a progress bar's final state). Pure.

    Example: `final_state(b"1/3\r2/3\r3/3\n") == b"3/3\n"`.
    """
    ending = b"\n" if line.endswith(b"\n") else b""
    body = line[:-1] if ending else line
    return body.rstrip(b"\r").rsplit(b"\r", 1)[-1] + ending


class Pump(threading.Thread):
    """Copies one child stream to ours line by line, prefixed, keeping a tail.

    Carriage-return updates (progress bars) are lines that are rewritten in
    place. With `live` (rank 0's stdout) each update is shown as it comes,
    prefixed, after a carriage return of our own, so the bar stays intact
    and live; otherwise, and in the log and the tail, a line counts as what
    it shows when it ends (`final_state`), so other ranks' updates are not
    mixed into rank 0's bar.
    """

    def __init__(self, fd: int, out, tag: bytes, tail, lock, log, live: bool = False,
                 quiet: bool = False) -> None:
        super().__init__(daemon=True)
        self.fd, self.out, self.tag, self.tail, self.lock, self.log = fd, out, tag, tail, lock, log
        self.live = live
        self.quiet = quiet  # TensorFlow's start-up lines go to the log only
        self._showing = b""  # the update shown last on an unfinished live line

    def _write(self, data: bytes) -> None:
        try:
            self.out.write(data)
            self.out.flush()
        except (OSError, ValueError):
            pass  # our stdout is gone (launcher ended): keep draining the child

    def _emit(self, line: bytes) -> None:
        line = final_state(line)
        data = self.tag + line + (b"" if line.endswith(b"\n") else b"\n")
        if self.quiet and startup_noise.is_startup_noise(line.decode(errors="replace")):
            self._log(data)
            return
        with self.lock:
            self.tail.append((self.tag.decode(errors="replace") + line.decode(errors="replace")).rstrip("\n"))
            self._write((b"\r" if self._showing else b"") + data)
            self._showing = b""
            self._log(data)

    def _log(self, data: bytes) -> None:
        """Appends to the rank's log file (callers hold no lock or the pump's)."""
        if self.log is not None:
            try:
                self.log.write(data)
                self.log.flush()
            except OSError:
                pass

    def _show_update(self, pending: bytes) -> None:
        """Shows the newest complete update of an unfinished line (live only)."""
        if not self.live or b"\r" not in pending:
            return
        update = pending.rstrip(b"\r").rsplit(b"\r", 1)[-1]
        if update and update != self._showing:
            with self.lock:
                self._write(b"\r" + self.tag + update)
                self._showing = update

    def run(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._emit(line + b"\n")
            if len(pending) > 65536:  # a very long line without newline
                self._emit(pending)
                pending = b""
            self._show_update(pending)
        if pending:
            self._emit(pending)
        os.close(self.fd)


def die_with_parent(sig: int) -> None:
    """Asks Linux to send `sig` to this process when its parent dies (no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _die_with_parent(parent_pid: int) -> None:
    """preexec_fn: SIGKILL this child when the shim dies, however it dies."""
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the shim died before prctl took effect
        os._exit(1)


def run(command: list[str], status_dir: Optional[str], log_dir: Optional[str], attempt: int,
        prefix: bool) -> int:
    rank = rank_from_env()
    # When the MPI proxy that started this shim dies (the launcher was killed),
    # stop the rank as if told to (SIGTERM is forwarded, then SIGKILL).
    parent = os.getppid()
    die_with_parent(signal.SIGTERM)
    if os.getppid() != parent:
        return 128 + signal.SIGTERM
    witness = _start_witness(status_dir, rank, attempt) if status_dir else None
    started = started_path(status_dir, rank) if status_dir else None
    if started:
        write_status(status_dir, {"rank": rank, "attempt": attempt, "host": socket.gethostname(),
                                  "pid": os.getpid(), "time": time.time()}, started)
    try:
        return _supervise(command, status_dir, log_dir, attempt, prefix, rank)
    finally:
        if started:
            try:
                os.unlink(started)
            except OSError:
                pass
        if witness is not None:
            try:
                os.write(witness, b"x")  # finished: the witness leaves without a record
                os.close(witness)
            except OSError:
                pass


def _start_witness(status_dir: str, rank: str, attempt: int) -> Optional[int]:
    """Starts this shim's witness; returns the pipe end to write when finished."""
    read_end, write_end = os.pipe()  # not inherited by the rank (os.pipe fds are not)
    try:
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--witness", str(read_end),
             "--status-dir", status_dir, "--attempt", str(attempt), "--rank", rank,
             "--shim-pid", str(os.getpid())],
            pass_fds=(read_end,), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        os.close(write_end)
        return None
    finally:
        os.close(read_end)
    return write_end


def _witness(fd: int, status_dir: str, rank: str, attempt: int, shim_pid: int) -> int:
    """Waits for the shim; records it as lost when it dies without finishing."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe ends this process
    try:
        finished = os.read(fd, 1)
    except OSError:
        finished = b""
    if not finished:
        write_status(status_dir, {"rank": rank, "attempt": attempt, "host": socket.gethostname(),
                                  "pid": shim_pid, "time": time.time()}, lost_path(status_dir, rank))
    return 0


def _supervise(command: list[str], status_dir: Optional[str], log_dir: Optional[str],
               attempt: int, prefix: bool, rank: str) -> int:
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    lock = threading.Lock()
    log = None
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
        log = open(os.path.join(log_dir, f"rank.{rank}.log"), "ab")
        log.write(f"=== attempt {attempt}, {time.strftime('%Y-%m-%d %H:%M:%S')}, host "
                  f"{socket.gethostname()}, pid {os.getpid()}: {' '.join(command)}\n".encode())
        log.flush()
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")  # lines reach the prefixer as they are printed
    if status_dir:
        env[FAILURE_RECORD_ENV] = status_path(status_dir, rank)
    try:
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, close_fds=False,  # keep inherited fds such as Hydra's PMI_FD
            preexec_fn=lambda parent=os.getpid(): _die_with_parent(parent),
        )
    except OSError as exc:
        message = f"cannot start {command[0]!r}: {exc.strerror or exc}"
        sys.stderr.write(f"[{rank}]<stderr>: hvdkerasrun: {message}\n")
        if status_dir:
            write_status(status_dir, {"rank": rank, "attempt": attempt, "exit_code": 127,
                                      "signal": None, "last_lines": [message], "time": time.time(),
                                      "host": socket.gethostname(), "pid": os.getpid()})
        return 127

    told_to_stop = threading.Event()

    def forward(signum, _frame):
        told_to_stop.set()
        try:
            child.send_signal(signum)
        except OSError:
            pass

    for sig in _FORWARDED:
        signal.signal(sig, forward)

    out = sys.stdout.buffer
    err = sys.stderr.buffer
    tag = (lambda stream: f"[{rank}]<{stream}>: ".encode()) if prefix else (lambda stream: b"")
    # Rank 0 alone shows progress bars live (Keras prints them on rank 0).
    quiet = startup_noise.quiet_requested(os.environ)  # Note [quiet start-up]
    pumps = [Pump(os.dup(child.stdout.fileno()), out, tag("stdout"), tail, lock, log,
                  live=rank == "0", quiet=quiet),
             Pump(os.dup(child.stderr.fileno()), err, tag("stderr"), tail, lock, log, quiet=quiet)]
    child.stdout.close()
    child.stderr.close()
    for pump in pumps:
        pump.start()

    stop_deadline = None
    while True:
        try:
            returncode = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        if told_to_stop.is_set():
            stop_deadline = stop_deadline or time.monotonic() + _KILL_GRACE_S
            if time.monotonic() > stop_deadline:
                child.kill()
    for pump in pumps:
        pump.join(timeout=5.0)

    if returncode < 0:
        exit_code, sig = 128 - returncode, signal_name(-returncode)
    else:
        exit_code, sig = returncode, None
    own_record = status_dir and os.path.exists(status_path(status_dir, rank))
    if exit_code != 0 and status_dir and not told_to_stop.is_set() and not own_record:
        with lock:
            last = list(tail)
        try:
            write_status(status_dir, {"rank": rank, "attempt": attempt,
                                      "exit_code": returncode if returncode >= 0 else None,
                                      "signal": sig, "last_lines": last, "time": time.time(),
                                      "host": socket.gethostname(), "pid": child.pid})
        except OSError as exc:
            sys.stderr.write(f"[{rank}]<stderr>: hvdkerasrun: cannot write status: {exc}\n")
    if log is not None:
        what = f"signal {sig}" if sig else f"exit code {exit_code}"
        log.write(f"=== attempt {attempt} ended: {what}\n".encode())
        log.close()
    return exit_code


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="rank_shim", description=__doc__.splitlines()[0])
    parser.add_argument("--status-dir")
    parser.add_argument("--log-dir")
    parser.add_argument("--attempt", type=int, default=1)
    parser.add_argument("--no-prefix", action="store_true")
    parser.add_argument("--witness", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    parser.add_argument("--shim-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.witness is not None:
        return _witness(args.witness, args.status_dir, args.rank, args.attempt, args.shim_pid)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    return run(command, args.status_dir, args.log_dir, args.attempt, not args.no_prefix)


if __name__ == "__main__":
    sys.exit(main())

"""`launch()`: run a command on N ranks through the right mpiexec; `hvdkerasrun`.

    hvdkerasrun -np 2 python train.py
    hvdkerasrun -np 4 -H a:2,b:2 --fusion-threshold-mb 32 --max-restarts 2 python train.py

What it adds on top of plain ``mpiexec``:

* the ``mpiexec`` of the MPI that mpi4py loads, checked (a launcher from
  another MPI aborts every rank or silently gives N worlds of size 1);
* engine knobs as flags (``--fusion-threshold-mb`` -> ``HVDKERAS_FUSION_THRESHOLD``, ...);
* ``[rank]<stdout>: `` prefixes and one log file per rank (``--output-dir``);
* fail fast: when a rank exits non-zero or dies, the others are ended and the
  launcher returns within 30 s, naming the rank, its exit code or signal and
  its last lines;
* ``--max-restarts K``: relaunch the whole job after a failure (with backoff).

Each rank runs ``python rank_shim.py ... -- COMMAND`` (see `rank_shim`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence, TextIO

from hvdkeras.runner import mpi_env, rank_shim
from hvdkeras.runner.hosts import (HostSlots, hydra_machinefile, openmpi_hostfile, parse_hostfile,
                                   parse_hosts, total_slots)
from hvdkeras.runner.knobs import Knobs, knob_env
from hvdkeras.runner.restart import RestartPolicy

EXPECTED_SIZE_ENV = "HVDKERAS_EXPECTED_SIZE"
ATTEMPT_ENV = "HVDKERAS_ATTEMPT"  # 1-based attempt number, seen by every rank
BACKOFF_ENV = "HVDKERAS_RESTART_BACKOFF_SECONDS"
# After a rank fails, how long mpiexec may take to end the others before the
# launcher kills its whole process group (then SIGKILL after KILL_GRACE_S).
FAILFAST_GRACE_S = 10.0
FAILFAST_GRACE_ENV = "HVDKERAS_FAILFAST_GRACE_SECONDS"
KILL_GRACE_S = 3.0
POLL_S = 0.2
TAIL_LINES = 20
SHIM = str(Path(rank_shim.__file__).resolve())
_PREFIX = re.compile(r"^\[(\d+)\]<(?:stdout|stderr)>: ")


class _Interrupted(Exception):
    """The launcher itself was told to stop (SIGTERM/SIGHUP)."""


@dataclasses.dataclass
class JobResult:
    """How a job ended (see `launch_job`).

    Attributes:
        exit_code: 0 on success; else the failing rank's exit code (128 + N
            for signal N), mpiexec's own code, or 130 when interrupted.
        attempts: How many times the job was started.
        failure: The first failing rank's record of the last attempt (keys
            rank, exit_code, signal, last_lines, host, time), if any.
        message: What went wrong, in words ("" on success).
    """

    exit_code: int
    attempts: int
    failure: Optional[dict] = None
    message: str = ""


def _log(message: str, log_file: Optional[str] = None) -> None:
    line = f"hvdkerasrun: {message}"
    print(line, file=sys.stderr, flush=True)
    if log_file:
        with open(log_file, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


# ---------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------


def _check_arguments(command, np, hosts, hostfile, env, max_restarts) -> Optional[list[HostSlots]]:
    if isinstance(command, (str, bytes)) or not command \
            or not all(isinstance(c, str) and c for c in command):
        raise ValueError("command must be a non-empty list of strings, e.g. ['python', 'train.py'].")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ValueError(f"np must be a whole number >= 1, got {np!r}.")
    if hosts and hostfile:
        raise ValueError("give either hosts (-H) or hostfile (--hostfile), not both.")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}.")
    if env is not None:
        bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)
               or not k or "=" in k]
        if bad:
            raise ValueError(f"env must map variable names to strings; bad entries: {bad!r}.")
    host_list = parse_hosts(hosts) if hosts else parse_hostfile(hostfile) if hostfile else None
    if host_list is not None and np > total_slots(host_list):
        raise ValueError(f"np={np} is more than the {total_slots(host_list)} slots of the hosts "
                         f"given ({', '.join(f'{h.host}:{h.slots}' for h in host_list)}).")
    return host_list


_RUNTIME_PREFIXES = ("PMI_", "PMIX_", "OMPI_COMM_WORLD_", "HYDI_", "HYDRA_PROXY")
_RUNTIME_NAMES = {"MPI_LOCALNRANKS", "MPI_LOCALRANKID", "OMPI_UNIVERSE_SIZE", "OMPI_FILE_LOCATION",
                  "HVDKERAS_UNDER_MPI"}


def inherited_env(environ) -> dict[str, str]:
    """This process's environment minus what an MPI launcher set for *it*.

    A launcher started from inside a rank (the function runner called from an
    MPI job, say) must not hand its own rank's PMI connection, rank or world
    size on to the new job's ranks.
    """
    return {k: v for k, v in environ.items()
            if not k.startswith(_RUNTIME_PREFIXES) and k not in _RUNTIME_NAMES}


_probe_cache: dict = {}


def _rank_python(command: Sequence[str]) -> str:
    """The interpreter the ranks run (the command's, when it is a python), else ours."""
    first = os.path.basename(command[0])
    if re.match(r"^python[0-9.]*$", first):
        found = shutil.which(command[0])
        if found:
            return found
    return sys.executable


def resolve_mpiexec(command: Sequence[str]) -> tuple[str, str, mpi_env.MpiLibrary]:
    """(mpiexec path, vendor, library) for `command`; raises mpi_env.LauncherError."""
    python = _rank_python(command)
    key = (python, os.environ.get(mpi_env.MPIEXEC_ENV, ""), os.environ.get("PATH", ""))
    if key not in _probe_cache:
        library = mpi_env.probe_library(python)
        path, vendor = mpi_env.choose_mpiexec(
            library, mpi_env.candidate_mpiexecs(library.path, python))
        _probe_cache[key] = (path, vendor, library)
    return _probe_cache[key]


# ---------------------------------------------------------------------------
# one attempt
# ---------------------------------------------------------------------------


class _Forwarder(threading.Thread):
    """Copies mpiexec's stdout or stderr to ours, keeping each rank's last lines."""

    def __init__(self, stream, sink: Callable[[], TextIO], tails: dict, lock) -> None:
        super().__init__(daemon=True)
        self.stream, self.sink, self.tails, self.lock = stream, sink, tails, lock

    def run(self) -> None:
        for line in iter(self.stream.readline, ""):
            match = _PREFIX.match(line)
            key = match.group(1) if match else "mpiexec"
            with self.lock:
                self.tails.setdefault(key, collections.deque(maxlen=TAIL_LINES)).append(line.rstrip("\n"))
            try:
                out = self.sink()
                out.write(line)
                out.flush()
            except (OSError, ValueError):
                pass
        self.stream.close()


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _describe(record: dict) -> str:
    where = f" on {record['host']}" if record.get("host") else ""
    if record.get("signal"):
        return f"rank {record['rank']}{where} was killed by signal {record['signal']}"
    return f"rank {record['rank']}{where} exited with code {record.get('exit_code')}"


# How a rank's collective fails after *another* rank shut the engine down or
# exited (ops/core/engine.cc): such a rank is a casualty, not the cause.
_CASUALTY = re.compile(r"hvdkeras (has been|was) shut down")


def is_casualty(text: str) -> bool:
    """Whether `text` (a rank's last lines or traceback) shows it failed because another rank left."""
    return bool(_CASUALTY.search(text or ""))


def first_failure(records: list[dict], text_of: Callable[[dict], str]) -> list[dict]:
    """`records` reordered so that the rank that failed first on its own comes first.

    Records are ordered by time, except that ranks whose failure only reports
    that the engine was shut down by another rank go after the others (a rank
    exiting with an error can take longer to finish than its peers take to notice).
    """
    ordered = sorted(records, key=lambda r: r.get("time", 0.0))
    return sorted(ordered, key=lambda r: is_casualty(text_of(r)))


def failure_report(records: list[dict], mpiexec_code: int, tails: dict) -> tuple[str, int]:
    """(message, exit code) for a failed attempt from the ranks' status records.

    Pure. The earliest record names the rank that failed first; without any
    (a rank on another host, a shim that was killed) mpiexec's code is used.
    """
    if records:
        records = first_failure(records, lambda r: "\n".join(r.get("last_lines") or []))
        first = records[0]
        lines = first.get("last_lines") or list(tails.get(str(first["rank"]), []))
        code = first.get("exit_code")
        if code is None or code == 0:
            try:
                code = 128 + signal.Signals[first.get("signal") or ""].value
            except KeyError:
                code = 1
        message = _describe(first)
        others = [str(r["rank"]) for r in records[1:]]
        if others:
            message += f" (then rank{'s' if len(others) > 1 else ''} {', '.join(others)} failed too)"
    else:
        code = mpiexec_code if mpiexec_code > 0 else (128 - mpiexec_code if mpiexec_code < 0 else 1)
        message = f"mpiexec exited with code {mpiexec_code} and no rank reported a failure"
        lines = list(tails.get("mpiexec", []))
    if lines:
        who = f"rank {records[0]['rank']}" if records else "mpiexec"
        message += f"\nlast lines of {who}:\n" + "\n".join(f"    {line}" for line in lines[-TAIL_LINES:])
    return message, code


class _Attempt:
    """Runs mpiexec once and supervises it."""

    def __init__(self, cmd: list[str], env: dict, status_dir: str,
                 deadline: Optional[float] = None) -> None:
        self.cmd, self.env, self.status_dir, self.deadline = cmd, env, status_dir, deadline
        self.tails: dict = {}
        self.lock = threading.Lock()
        self.enforced = False
        self.timed_out = False
        self.grace = float(env.get(FAILFAST_GRACE_ENV) or FAILFAST_GRACE_S)

    def run(self) -> tuple[int, list[dict], float, dict]:
        """(mpiexec exit code, failure records, seconds from the first failure to the end,
        last lines per rank)."""
        proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1,
                                env=self.env, start_new_session=True)
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
                    _kill_group(proc, signal.SIGTERM)
                if self.deadline is not None and now > self.deadline and killed_at is None:
                    self.timed_out = True
                    killed_at = now
                    _kill_group(proc, signal.SIGTERM)
                if killed_at is not None and now - killed_at > KILL_GRACE_S:
                    _kill_group(proc, signal.SIGKILL)
        except BaseException:
            _kill_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            _kill_group(proc, signal.SIGKILL)
            proc.wait()
            raise
        finally:
            # Nothing of this attempt may outlive it (orphaned proxies or ranks).
            _kill_group(proc, signal.SIGKILL)
            for f in forwarders:
                f.join(timeout=5.0)
        records = rank_shim.read_statuses(self.status_dir)
        # Wall-clock time from the first rank's failure until everything ended.
        elapsed = max(0.0, time.time() - records[0].get("time", time.time())) if records else 0.0
        return proc.returncode, records, elapsed, self.tails


# ---------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------


def launch(command: list[str], np: int, hosts: str | None = None, hostfile: str | None = None,
           env: dict[str, str] | None = None, output_dir: str | None = None,
           max_restarts: int = 0, prefix_output: bool = True) -> int:
    """Runs `command` on `np` ranks through the mpiexec of the MPI that mpi4py loads.

    Args:
        command: The program and its arguments, e.g. ``["python", "train.py"]``.
        np: Number of ranks.
        hosts: ``"host1:2,host2:2"`` (horovodrun's ``-H``); default: this machine.
        hostfile: A file of ``host slots=N`` lines (horovodrun's ``--hostfile``).
        env: Variables set for every rank, on top of this process's environment
            (e.g. `hvdkeras.runner.knobs.knob_env` output).
        output_dir: Also write each rank's output to ``output_dir/rank.<r>.log``
            and the launcher's messages to ``output_dir/launcher.log``.
        max_restarts: After a failure, relaunch the whole job up to this many
            times (backoff 1 s, 2 s, 4 s, ... up to 30 s). Each rank sees the
            attempt number in ``HVDKERAS_ATTEMPT`` (1-based).
        prefix_output: Prefix each line with ``[rank]<stdout>: `` / ``<stderr>: ``.

    Returns:
        0 on success, else the failing rank's exit code (128 + N for signal
        N), or mpiexec's when no rank reported; 130 when interrupted.

    Raises:
        ValueError: bad arguments (empty command, np < 1, unreadable hostfile,
            more ranks than slots, ...).
        hvdkeras.runner.mpi_env.LauncherError: no mpiexec of the MPI that
            mpi4py loads.
    """
    return launch_job(command, np, hosts=hosts, hostfile=hostfile, env=env, output_dir=output_dir,
                      max_restarts=max_restarts, prefix_output=prefix_output).exit_code


def launch_job(command: list[str], np: int, hosts: str | None = None, hostfile: str | None = None,
               env: dict[str, str] | None = None, output_dir: str | None = None,
               max_restarts: int = 0, prefix_output: bool = True,
               timeout: float | None = None) -> JobResult:
    """`launch` returning a `JobResult` (exit code, attempts, the failing rank's record).

    `timeout` (seconds, all attempts together) ends every rank and returns
    exit code 124 when the job runs longer.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}.")
    deadline = time.monotonic() + timeout if timeout is not None else None
    command = list(command) if isinstance(command, (list, tuple)) else command
    host_list = _check_arguments(command, np, hosts, hostfile, env, max_restarts)
    mpiexec, vendor, _library = resolve_mpiexec(command)
    backoff = float((env or {}).get(BACKOFF_ENV) or os.environ.get(BACKOFF_ENV) or 1)
    policy = RestartPolicy(max_restarts=max_restarts, backoff_s=backoff)

    log_file = None
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        log_file = os.path.join(os.path.abspath(output_dir), "launcher.log")
    job_dir = tempfile.mkdtemp(prefix="hvdkerasrun-")
    try:
        plan_hosts, plan_hostfile = None, None
        if host_list is not None and hostfile:
            plan_hostfile = os.path.join(job_dir, "hostfile")
            text = openmpi_hostfile(host_list) if vendor == mpi_env.OPENMPI else hydra_machinefile(host_list)
            Path(plan_hostfile).write_text(text, encoding="utf-8")
        elif host_list is not None:
            plan_hosts = host_list
        extra_env = dict(env or {})
        rank_env = inherited_env(os.environ)
        rank_env.update(extra_env)
        rank_env[EXPECTED_SIZE_ENV] = str(np)
        rank_env.setdefault("PYTHONUNBUFFERED", "1")
        plan = mpi_env.LaunchPlan(
            mpiexec=mpiexec, vendor=vendor, np=np, hosts=plan_hosts, hostfile=plan_hostfile,
            env_names=mpi_env.forwarded_env_names([*extra_env, EXPECTED_SIZE_ENV, ATTEMPT_ENV], rank_env),
            as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
            extra_args=tuple(shlex.split(os.environ.get(mpi_env.MPIEXEC_ARGS_ENV, ""))),
        )
        return _run_attempts(command, plan, rank_env, policy, job_dir, output_dir, log_file,
                             prefix_output, deadline)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def _run_attempts(command, plan, rank_env, policy, job_dir, output_dir, log_file,
                  prefix_output, deadline=None) -> JobResult:
    previous = {}
    interrupted = []
    if threading.current_thread() is threading.main_thread():
        def stop(signum, _frame):
            interrupted.append(signum)
            raise _Interrupted()

        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, stop)
    try:
        attempt = 1
        while True:
            status_dir = os.path.join(job_dir, f"attempt-{attempt}")
            os.makedirs(status_dir)
            program = [sys.executable, SHIM, "--status-dir", status_dir, "--attempt", str(attempt)]
            if output_dir:
                program += ["--log-dir", os.path.abspath(output_dir)]
            if not prefix_output:
                program.append("--no-prefix")
            cmd = mpi_env.mpiexec_command(plan, program + ["--", *command])
            env = dict(rank_env)
            env[ATTEMPT_ENV] = str(attempt)
            _log(f"attempt {attempt} of {policy.max_attempts}: {plan.np} rank(s) of "
                 f"{shlex.join(command)} via {plan.mpiexec}", log_file)
            started = time.monotonic()
            supervisor = _Attempt(cmd, env, status_dir, deadline)
            try:
                code, records, since_failure, tails = supervisor.run()
            except (KeyboardInterrupt, _Interrupted):
                _log(f"attempt {attempt} interrupted; all ranks ended", log_file)
                return JobResult(130, attempt, None, "interrupted")
            took = time.monotonic() - started
            if supervisor.timed_out:
                message = f"the job ran past its timeout; attempt {attempt} ended after {took:.1f} s"
                _log(message, log_file)
                return JobResult(124, attempt, None, message)
            if code == 0 and not records:
                _log(f"attempt {attempt} of {policy.max_attempts} succeeded in {took:.1f} s", log_file)
                return JobResult(0, attempt)
            message, exit_code = failure_report(records, code, tails)
            headline, _, details = message.partition("\n")
            if records and plan.np > 1:
                headline += f"; all ranks ended {since_failure:.1f} s after it failed"
            _log(f"attempt {attempt} of {policy.max_attempts} failed after {took:.1f} s: {headline}",
                 log_file)
            if details:
                _log(details, log_file)
            if not policy.should_restart(attempt, exit_code):
                if policy.max_restarts:
                    _log(f"giving up after {attempt} attempt(s); exit code {exit_code}", log_file)
                first = first_failure(records, lambda r: "\n".join(r.get("last_lines") or []))
                return JobResult(exit_code, attempt, first[0] if first else None, message)
            wait = policy.backoff(attempt)
            _log(f"restarting the job in {wait:g} s (attempt {attempt + 1} of {policy.max_attempts})",
                 log_file)
            time.sleep(wait)
            attempt += 1
    except _Interrupted:
        return JobResult(130, attempt, None, "interrupted")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------
# hvdkerasrun
# ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hvdkerasrun",
        usage="hvdkerasrun -np N [-H HOSTS | --hostfile FILE] [options] COMMAND [ARGS...]",
        description="Run COMMAND on N ranks with the mpiexec of the MPI that mpi4py loads, "
                    "rank-prefixed output, fail-fast and restarts.")
    p.add_argument("-np", "--num-proc", "-n", dest="np", type=int, help="number of ranks")
    p.add_argument("-H", "--hosts", help="hosts and slots, e.g. a:2,b:2 (default: this machine)")
    p.add_argument("--hostfile", "-hostfile", help="file of 'host slots=N' lines")
    g = p.add_argument_group("engine knobs (HVDKERAS_* variables for every rank)")
    g.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MiB (0: no fusion)")
    g.add_argument("--cycle-time-ms", type=float, help="engine cycle time in ms")
    g.add_argument("--cache-capacity", type=int, help="response cache entries (0: off)")
    g.add_argument("--timeline-filename", help="rank 0 writes a Chrome trace here")
    g.add_argument("--timeline-mark-cycles", action="store_true", help="mark engine cycles in the timeline")
    g.add_argument("--autotune", action="store_true", help="tune fusion threshold and cycle time online")
    g.add_argument("--autotune-log-file", help="CSV log of autotune trials")
    g.add_argument("--stall-check-seconds", type=float, help="warn about stalled collectives after S s")
    g.add_argument("--no-stall-check", action="store_true", help="disable stall warnings")
    g.add_argument("--stall-shutdown-seconds", type=float, help="fail stalled collectives after S s")
    g.add_argument("--log-level", choices=sorted(knobs_levels()), type=str.lower,
                   help="HVDKERAS_LOG_LEVEL and TensorFlow's C++ log level")
    o = p.add_argument_group("job control")
    o.add_argument("--output-dir", "--output-filename", dest="output_dir",
                   help="also write rank.<r>.log per rank and launcher.log here")
    o.add_argument("--max-restarts", type=int, default=0, help="relaunch the job up to K times after a failure")
    o.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with the rank")
    o.add_argument("--mpi-args", default="", help="extra arguments for mpiexec, e.g. '-launcher slurm'")
    o.add_argument("--check-build", action="store_true", help="print what `hvdkeras check` prints and exit")
    o.add_argument("--verbose", action="store_true", help="print the mpiexec in use")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program to run on every rank")
    return p


def knobs_levels():
    from hvdkeras.runner.knobs import LOG_LEVELS

    return LOG_LEVELS


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.check_build:
        # In a fresh interpreter: `hvdkerasrun` runs without importing TensorFlow.
        return subprocess.call([sys.executable, "-m", "hvdkeras.cli", "check"])
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.np is None:
        parser.error("-np N is required")
    if not command:
        parser.error("no COMMAND given (e.g. hvdkerasrun -np 2 python train.py)")
    knobs = Knobs(
        fusion_threshold_mb=args.fusion_threshold_mb, cycle_time_ms=args.cycle_time_ms,
        cache_capacity=args.cache_capacity, timeline_filename=args.timeline_filename,
        timeline_mark_cycles=args.timeline_mark_cycles, autotune=args.autotune,
        autotune_log_file=args.autotune_log_file, stall_check_seconds=args.stall_check_seconds,
        no_stall_check=args.no_stall_check, stall_shutdown_seconds=args.stall_shutdown_seconds,
        log_level=args.log_level)
    try:
        env = knob_env(knobs)
        if args.mpi_args:
            os.environ[mpi_env.MPIEXEC_ARGS_ENV] = args.mpi_args
        if args.verbose:
            mpiexec, vendor, library = resolve_mpiexec(command)
            _log(f"mpiexec {mpiexec} ({mpi_env.VENDOR_NAMES[vendor]}) for libmpi {library.path}")
        return launch(command, args.np, hosts=args.hosts, hostfile=args.hostfile, env=env,
                      output_dir=args.output_dir, max_restarts=args.max_restarts,
                      prefix_output=not args.no_prefix)
    except (ValueError, mpi_env.LauncherError) as exc:
        print(f"hvdkerasrun: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

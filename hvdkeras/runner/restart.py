"""The attempts of a job: run one, report how it failed, and relaunch the
whole job after a failure (`hvdkerasrun --max-restarts K`) with backoff,
following `RestartPolicy` (pure).

What may import this module: the rest of `hvdkeras.runner` (standard
library only).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import sys
import threading
import time
from typing import Optional

from hvdkeras.engine.config import EXPECTED_SIZE
from hvdkeras.engine.failfast import is_casualty
from hvdkeras.runner import elastic as elastic_world
from hvdkeras.runner import mpi_env, slurm_nodes
from hvdkeras.runner.attempt import SHIM, Attempt
from hvdkeras.runner.failures import failure_report, first_failure
from hvdkeras.runner.hosts import hosts_argument, total_slots

ATTEMPT_ENV = "HVDKERAS_ATTEMPT"  # 1-based attempt number, seen by every rank


def _vanished(started: list, records: list, lost: Optional[list]) -> list:
    """(rank, host) of the ranks whose supervisors started and left neither a
    failure record nor a lost mark while others were ended (see
    failure_report and rank_shim.started_path)."""
    if records or not lost:
        return []
    seen = {str(m.get("rank")) for m in lost}
    return [(int(m["rank"]), str(m.get("host", ""))) for m in started
            if str(m.get("rank")) not in seen and str(m.get("rank", "")).isdigit()]


class _Interrupted(Exception):
    """The launcher itself was told to stop (SIGTERM/SIGHUP)."""


@dataclasses.dataclass
class JobResult:
    """How a job ended (see `hvdkeras.runner.launch.launch_job`).

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


def log(message: str, log_file: Optional[str] = None) -> None:
    """Prints "hvdkerasrun: message" to stderr (and appends it to `log_file`)."""
    line = f"hvdkerasrun: {message}"
    print(line, file=sys.stderr, flush=True)
    if log_file:
        with open(log_file, "a", encoding="utf-8") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """Relaunch the whole job after a failure, up to `max_restarts` times.

    Attributes:
        max_restarts: Relaunches allowed after the first attempt (0: none).
        backoff_s: Wait before the first relaunch; doubles each time.
        max_backoff_s: Upper bound of the wait.
    """

    max_restarts: int = 0
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0

    def __post_init__(self):
        if not isinstance(self.max_restarts, int) or isinstance(self.max_restarts, bool) \
                or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be a whole number >= 0, got {self.max_restarts!r}.")
        if not self.backoff_s >= 0 or not self.max_backoff_s >= 0:
            raise ValueError("restart backoff must be >= 0 seconds.")

    @property
    def max_attempts(self) -> int:
        return self.max_restarts + 1

    def should_restart(self, attempt: int, exit_code: int, interrupted: bool = False) -> bool:
        """Whether to relaunch after attempt number `attempt` (1-based) ended with `exit_code`.

        A successful job, a job the user interrupted (Ctrl-C, SIGTERM to the
        launcher) and the last allowed attempt are never relaunched.

        >>> RestartPolicy(2).should_restart(1, 3)
        True
        >>> RestartPolicy(2).should_restart(3, 3)
        False
        """
        return exit_code != 0 and not interrupted and attempt < self.max_attempts

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before relaunching after attempt `attempt` (1-based) failed."""
        return min(self.backoff_s * (2 ** max(attempt - 1, 0)), self.max_backoff_s)


@dataclasses.dataclass
class ElasticState:
    """An elastic job's settings and the hosts its last attempt ran on.

    `local` jobs (no -H or hostfile) run on this machine; `hosts` then holds
    one entry for it, with the current number of ranks as its slots.
    """

    settings: elastic_world.Elastic
    hosts: list
    local: bool


def _failed_hosts(records: list, lost: list, hosts: list, vanished: list = ()) -> list:
    """The host of every rank that failed on its own (not a casualty), or else of
    the supervisor killed first (mpiexec kills the others' supervisors after it).
    Ranks that did not answer a watchdog (`silent_ranks` in its record: their
    host or its link is gone), or that vanished without a trace, are the
    failed ones, not the rank that asked or those mpiexec ended."""
    silent = sorted({int(r) for record in records for r in record.get("silent_ranks") or []})
    if silent:
        return elastic_world.hosts_of_ranks(hosts, silent)
    if vanished:
        return [host for _, host in vanished]
    if records:
        own = [r for r in records if not is_casualty("\n".join(r.get("last_lines") or []))]
        return [str(r.get("host") or "") for r in (own or records[:1])]
    first = sorted(lost, key=lambda m: m.get("time", 0.0))[:1]
    return [str(m.get("host") or "") for m in first]


def _resize(plan, state: ElasticState, records: list, lost: list, log_file, vanished=()):
    """The next attempt's plan, or None when fewer than --min-np ranks are left."""
    if state.settings.discovery_script:
        available = elastic_world.discover(state.settings.discovery_script)
        why = f"the host-discovery script reports {total_slots(available)} slot(s)"
    else:
        failed = _failed_hosts(records, lost, state.hosts, list(vanished))
        available = elastic_world.without_failed(state.hosts, failed)
        why = f"the slot(s) of {len(failed)} failed rank(s) left out"
    chosen = elastic_world.fit_world(available, state.settings)
    if chosen is None:
        log(f"only {total_slots(available)} slot(s) available ({why}), fewer than --min-np "
            f"{state.settings.min_np}: not restarting", log_file)
        return None
    np = total_slots(chosen)
    if np != plan.np:
        where = "" if state.local else f" on {hosts_argument(chosen)}"
        log(f"resizing the job from {plan.np} to {np} rank(s){where} ({why}); the ranks see "
            f"hvd.size() == {np}", log_file)
    state.hosts = chosen
    if state.local:
        return dataclasses.replace(plan, np=np)
    return dataclasses.replace(plan, np=np, hosts=chosen, hostfile=None)


def run_attempts(command, plan, rank_env, policy, job_dir, output_dir, log_file,
                 prefix_output, deadline=None,
                 elastic: Optional[ElasticState] = None) -> JobResult:
    """Runs the job until an attempt succeeds or `policy` gives up.

    Each attempt gets its own status directory under `job_dir`; SIGTERM and
    SIGHUP to the launcher (main thread only) end the attempt's ranks and
    the loop (exit code 130). With `elastic`, each relaunch runs on the
    ranks that are available then (see hvdkeras/runner/elastic.py).
    """
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
            env[EXPECTED_SIZE] = str(plan.np)
            log(f"attempt {attempt} of {policy.max_attempts}: {plan.np} rank(s) of "
                 f"{shlex.join(command)} via {plan.mpiexec}", log_file)
            started = time.monotonic()
            supervisor = Attempt(cmd, env, status_dir, deadline)
            try:
                code, records, since_failure, tails = supervisor.run()
            except (KeyboardInterrupt, _Interrupted):
                log(f"attempt {attempt} interrupted; all ranks ended", log_file)
                trouble = slurm_nodes.node_trouble(os.environ)
                if trouble:
                    log(trouble, log_file)
                return JobResult(130, attempt, None, trouble or "interrupted")
            took = time.monotonic() - started
            if supervisor.timed_out:
                message = f"the job ran past its timeout; attempt {attempt} ended after {took:.1f} s"
                log(message, log_file)
                return JobResult(124, attempt, None, message)
            if code == 0 and not records:
                log(f"attempt {attempt} of {policy.max_attempts} succeeded in {took:.1f} s", log_file)
                return JobResult(0, attempt)
            vanished = _vanished(supervisor.started, records, supervisor.lost)
            message, exit_code = failure_report(records, code, tails, supervisor.lost, vanished)
            trouble = slurm_nodes.node_trouble(os.environ)
            if trouble:  # the node Slurm lost comes first: it is the cause
                message = f"{trouble}; {message}"
            headline, _, details = message.partition("\n")
            if records and plan.np > 1:
                headline += f"; all ranks ended {since_failure:.1f} s after it failed"
            log(f"attempt {attempt} of {policy.max_attempts} failed after {took:.1f} s: {headline}",
                 log_file)
            if details:
                log(details, log_file)
            if not policy.should_restart(attempt, exit_code):
                if policy.max_restarts:
                    log(f"giving up after {attempt} attempt(s); exit code {exit_code}", log_file)
                first = first_failure(records, lambda r: "\n".join(r.get("last_lines") or []))
                return JobResult(exit_code, attempt, first[0] if first else None, message)
            if elastic is not None:
                try:
                    resized = _resize(plan, elastic, records, supervisor.lost, log_file,
                                      vanished)
                except ValueError as exc:  # the discovery script failed
                    log(f"cannot restart: {exc}", log_file)
                    resized = None
                if resized is None:
                    first = first_failure(records, lambda r: "\n".join(r.get("last_lines") or []))
                    return JobResult(exit_code, attempt, first[0] if first else None, message)
                plan = resized
            wait = policy.backoff(attempt)
            log(f"restarting the job in {wait:g} s (attempt {attempt + 1} of {policy.max_attempts})",
                 log_file)
            time.sleep(wait)
            attempt += 1
    except _Interrupted:
        return JobResult(130, attempt, None, "interrupted")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

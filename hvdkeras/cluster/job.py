"""A job of N ranks started by a cluster engine's tasks, one rank per task:
what `hvdkeras.spark.run` and `hvdkeras.ray.run` share.

How the ranks form one MPI world (no ssh, no launcher spanning hosts):

1. The driver starts an authenticated service (`hvdkeras.runner.service`,
   HMAC-SHA256 over a per-job secret) holding the cloudpickled function
   (`JobState` answers its requests).
2. The engine (Spark's barrier stage, Ray's actors in a placement group)
   runs N tasks together. Each task runs `run_task_rank`: it starts its rank
   as a child, ``mpiexec -n 1 python -m hvdkeras.cluster.task_rank``, a
   one-process MPI job on the task's own host, inside the task's
   container/cgroup and environment, and ended with it (process group,
   parent-death signal), and supervises it.
3. Each rank opens an MPI port, publishes it through the service, and the
   ranks join with MPI connect/accept (`connect.chain_connect`) into one
   intracommunicator ordered by task index, passed to
   ``hvdkeras.init(comm=...)``.
4. Each rank sends its result, or its exception and traceback, to the
   service; `results_or_raise` returns the results in rank order or raises
   `RankFailedError`. After a rank fails every task ends its rank at its
   next poll of the service, and the engine front end cancels what is left.

Why a child process rather than MPI inside the engine's worker process:
singleton-initialised MPICH 5.0.x processes cannot connect/accept
("Local and remote groups ... must not contain the same processes",
pmodels/mpich#7805, reproduced with the mpich 5.0.2 wheel), while one-process
Hydra jobs can; a child also leaves the worker reusable for later jobs (MPI
can be initialised only once per process).

What may import this module: the engine front ends (`hvdkeras.spark.runner`,
`hvdkeras.ray.runner`).
"""

from __future__ import annotations

import collections
import ctypes
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Optional, Sequence

from hvdkeras.cluster import task_env
from hvdkeras.engine.config import EXPECTED_SIZE
from hvdkeras.runner import mpi_env, rank_shim
from hvdkeras.runner.failures import first_failure
from hvdkeras.runner.function_runner import RankFailedError, raise_rank_error
from hvdkeras.runner.launch import inherited_env, resolve_mpiexec
from hvdkeras.runner.service import Client, ServiceError

POLL_S = 0.5
KILL_GRACE_S = 5.0
# After a rank fails, how long the other tasks get to end before the engine
# front end cancels them.
CANCEL_GRACE_S = 10.0


class JobState:
    """What the driver's service knows about one `run` call."""

    def __init__(self, task_blob: bytes, size: int) -> None:
        self.task_blob = task_blob
        self.size = size
        self.ports: dict[int, str] = {}
        self.results: dict[int, bytes] = {}
        self.errors: list[dict] = []
        self.abort_reason: Optional[str] = None
        self.failed = threading.Event()
        self.lock = threading.Lock()

    def handle(self, kind: str, fields: dict) -> Any:
        with self.lock:
            if kind == "task":
                return self.task_blob
            if kind == "put_port":
                self.ports[int(fields["index"])] = str(fields["port"])
                return None
            if kind == "get_ports":
                done = len(self.ports) == self.size
                return {"ports": [self.ports[i] for i in range(self.size)] if done else None,
                        "abort": self.abort_reason}
            if kind == "put_result":
                self.results[int(fields["rank"])] = fields["blob"]
                return None
            if kind == "put_error":
                record = dict(fields["record"])
                self.errors.append(record)
                if self.abort_reason is None:
                    self.abort_reason = f"rank {record['rank']} failed ({record.get('type', 'error')})"
                self.failed.set()
                return None
            if kind == "status":
                return {"abort": self.abort_reason}
        raise ValueError(f"unknown request {kind!r}")


def rank_command(executable: Optional[str], extra_mpi_args: Sequence[str],
                 what: str) -> list[str]:
    """``mpiexec [extra] -n 1 python -m hvdkeras.cluster.task_rank`` with this environment's MPICH."""
    mpiexec, vendor, library = resolve_mpiexec([sys.executable])
    if vendor == mpi_env.OPENMPI:
        raise RuntimeError(
            f"{what} joins its ranks with MPI connect/accept between separately "
            f"started jobs, which needs MPICH (pip install mpich); mpi4py loads Open MPI "
            f"({library.path}).")
    return [mpiexec, *extra_mpi_args, "-n", "1", executable or sys.executable, "-m",
            "hvdkeras.cluster.task_rank"]


def stop_rank(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_task_rank(index: int, size: int, address: str, secret_hex: str,
                  extra_env: dict, command: Sequence[str], what: str) -> int:
    """Body of one task: start the rank, supervise it, report a crash.

    Args:
        index, size: The rank and the number of ranks.
        address, secret_hex: The driver's service and the job's secret.
        extra_env: More variables for the rank.
        command: The rank's command (`rank_command`).
        what: The runner's name for messages ("hvdkeras.spark.run").

    Returns:
        The rank's exit code (0); anything else raises RuntimeError.
    """
    env = inherited_env(os.environ)  # not the worker's own MPI runtime, if it has one
    env.pop(EXPECTED_SIZE, None)  # the rank's COMM_WORLD is 1; its world is the joined comm
    env.update(extra_env)
    secret_file = task_env.write_secret_file(secret_hex)  # the rank removes it at start
    env.update({task_env.ADDRESS_ENV: address, task_env.SECRET_FILE_ENV: secret_file,
                task_env.INDEX_ENV: str(index), task_env.SIZE_ENV: str(size),
                "PYTHONUNBUFFERED": "1"})
    host, _, port = address.rpartition(":")
    try:
        client = Client((host, int(port)), bytes.fromhex(secret_hex))
        proc = subprocess.Popen(list(command), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True,
                                preexec_fn=_term_with_parent)
    except BaseException:
        _remove(secret_file)
        raise
    tail: Any = collections.deque(maxlen=rank_shim.TAIL_LINES)
    lock = threading.Lock()
    pumps = [rank_shim.Pump(os.dup(proc.stdout.fileno()), _buffer(sys.stdout),
                             f"[{index}]<stdout>: ".encode(), tail, lock, None),
             rank_shim.Pump(os.dup(proc.stderr.fileno()), _buffer(sys.stderr),
                             f"[{index}]<stderr>: ".encode(), tail, lock, None)]
    proc.stdout.close()
    proc.stderr.close()
    for pump in pumps:
        pump.start()
    try:
        while True:
            try:
                code = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            abort = client.request("status")["abort"]
            if abort:
                stop_rank(proc)
                raise RuntimeError(f"{what}: rank {index} ended because {abort}")
        for pump in pumps:
            pump.join(timeout=5.0)
        if code != 0:
            with lock:
                last = list(tail)
            ended = (f"was killed by signal {rank_shim.signal_name(-code)}" if code < 0
                     else f"exited with code {code}")
            try:  # the rank may have reported its exception already; a crash it cannot
                client.request("put_error", record={
                    "rank": index, "type": "RankCrashed", "message": f"rank {index} {ended}",
                    "traceback": "last lines:\n" + "\n".join(last), "time": time.time(),
                    "exception": None})
            except ServiceError:
                pass
            raise RuntimeError(f"{what}: rank {index} {ended}")
        return code
    finally:
        if proc.poll() is None:
            stop_rank(proc)
        client.close()
        _remove(secret_file)  # the rank normally removed it already


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _buffer(stream):
    return getattr(stream, "buffer", stream)


def _term_with_parent() -> None:
    """preexec_fn: SIGTERM the rank's mpiexec when the task's process dies."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def results_or_raise(state: JobState, size: int, what: str, engine_error: Optional[BaseException] = None,
                     timed_out_after: Optional[float] = None) -> list:
    """The ranks' results in rank order, or the job's failure as RankFailedError.

    Args:
        state: The job's service state after the engine's tasks ended.
        size: The number of ranks.
        what: The runner's name for messages.
        engine_error: What the engine raised while running the tasks, if anything.
        timed_out_after: The timeout (s) when the run was ended for it.
    """
    with state.lock:
        errors = first_failure(state.errors, lambda e: f"{e['message']}\n{e['traceback']}")
        results = dict(state.results)
    if timed_out_after is not None:
        raise RankFailedError(f"{what}: the run timed out after {timed_out_after:g} s; "
                              "its ranks were ended")
    if errors:
        # A rank that raised is reported twice: by itself (with its traceback)
        # and by its task (exit code 1); keep the first.
        raised = {e["rank"] for e in errors if e.get("type") != "RankCrashed"}
        errors = [e for e in errors if e.get("type") != "RankCrashed" or e["rank"] not in raised]
        raise_rank_error(errors[0], size)
    if engine_error is not None:
        raise RankFailedError(f"{what}: the job failed: {engine_error}") from engine_error
    missing = [r for r in range(size) if r not in results]
    if missing:
        raise RankFailedError(f"{what}: ranks {missing} returned no result")
    return [pickle.loads(results[r]) for r in range(size)]

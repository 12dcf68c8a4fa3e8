"""`hvdkeras.spark.run`: a function on N Spark tasks (barrier mode), one rank per task.

How the ranks form one MPI world (no ssh, no launcher spanning hosts):

1. The driver starts an authenticated service (`hvdkeras.runner.service`,
   HMAC-SHA256 over a per-job secret) holding the cloudpickled function.
2. A barrier stage of `num_proc` tasks runs; Spark starts them together.
   Each task starts its rank as a child, ``mpiexec -n 1 python -m
   hvdkeras.spark.task_rank``: a one-process MPI job on the task's own
   host, inside the task's container/cgroup and environment, and ended with
   it (process group, parent-death signal).
3. Each rank opens an MPI port, publishes it through the service, and the
   ranks join with MPI connect/accept (`connect.chain_connect`) into one
   intracommunicator ordered by task index, passed to
   ``hvdkeras.init(comm=...)``.
4. Each rank sends its result, or its exception and traceback, to the
   service; the driver returns the results in rank order or raises
   `RankFailedError`. After a rank fails the driver tells the other tasks to
   end their ranks and cancels the Spark job, so nothing waits forever.

Why a child process rather than MPI inside the Python worker itself:
singleton-initialised MPICH 5.0.x processes cannot connect/accept
("Local and remote groups ... must not contain the same processes",
pmodels/mpich#7805, reproduced with the mpich 5.0.2 wheel), while one-process
Hydra jobs can; a child also leaves the Python worker reusable for later
Spark jobs (MPI can be initialised only once per process).
"""

from __future__ import annotations

import collections
import ctypes
import os
import pickle
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

import cloudpickle

from hvdkeras.engine.config import EXPECTED_SIZE
from hvdkeras.runner import mpi_env, rank_shim
from hvdkeras.runner.failures import first_failure
from hvdkeras.runner.function_runner import RankFailedError, raise_rank_error
from hvdkeras.runner.launch import inherited_env, resolve_mpiexec
from hvdkeras.runner.service import Client, Service, ServiceError, new_secret
from hvdkeras.spark import task_env

DRIVER_HOST_ENV = "HVDKERAS_SPARK_DRIVER_HOST"
POLL_S = 0.5
KILL_GRACE_S = 5.0
# After a rank fails, how long the other tasks get to end before the Spark job is cancelled.
CANCEL_GRACE_S = 10.0


class _JobState:
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


def _rank_command(executable: Optional[str] = None,
                  extra_mpi_args: Sequence[str] = ()) -> list[str]:
    """``mpiexec [extra] -n 1 python -m hvdkeras.spark.task_rank`` with this environment's MPICH."""
    mpiexec, vendor, library = resolve_mpiexec([sys.executable])
    if vendor == mpi_env.OPENMPI:
        raise RuntimeError(
            f"hvdkeras.spark.run joins its ranks with MPI connect/accept between separately "
            f"started jobs, which needs MPICH (pip install mpich); mpi4py loads Open MPI "
            f"({library.path}).")
    return [mpiexec, *extra_mpi_args, "-n", "1", executable or sys.executable, "-m",
            "hvdkeras.spark.task_rank"]


def _stop(proc: subprocess.Popen) -> None:
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


def _run_task_rank(index: int, size: int, address: str, secret_hex: str,
                   extra_env: dict, command: Sequence[str] = ()) -> int:
    """Body of one Spark task: start the rank, supervise it, report a crash."""
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
        proc = subprocess.Popen(list(command) or _rank_command(), stdin=subprocess.DEVNULL,
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
                _stop(proc)
                raise RuntimeError(f"hvdkeras.spark.run: rank {index} ended because {abort}")
        for pump in pumps:
            pump.join(timeout=5.0)
        if code != 0:
            with lock:
                last = list(tail)
            what = (f"was killed by signal {rank_shim.signal_name(-code)}" if code < 0
                    else f"exited with code {code}")
            try:  # the rank may have reported its exception already; a crash it cannot
                client.request("put_error", record={
                    "rank": index, "type": "RankCrashed", "message": f"rank {index} {what}",
                    "traceback": "last lines:\n" + "\n".join(last), "time": time.time(),
                    "exception": None})
            except ServiceError:
                pass
            raise RuntimeError(f"hvdkeras.spark.run: rank {index} {what}")
        return code
    finally:
        if proc.poll() is None:
            _stop(proc)
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
    """preexec_fn: SIGTERM the rank's mpiexec when the Spark task process dies."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _make_partition_fn(size: int, address: str, secret_hex: str, extra_env: dict,
                       executable: Optional[str] = None,
                       extra_mpi_args: Sequence[str] = ()) -> Callable:
    def partition(_iterator):
        from pyspark import BarrierTaskContext  # lazy: an optional extra (hvdkeras[spark])

        context = BarrierTaskContext.get()
        index = context.partitionId()
        code = _run_task_rank(index, size, address, secret_hex, extra_env,
                              _rank_command(executable, extra_mpi_args))
        return [(index, code)]

    return partition


def _driver_host(sc) -> str:
    configured = os.environ.get(DRIVER_HOST_ENV, "").strip()
    if configured:
        return configured
    return sc.getConf().get("spark.driver.host", None) or socket.gethostname()


def service_bind_address(host: str) -> str:
    """The address the driver's service listens on: the one its tasks reach.

    The tasks connect to `host` (Spark's driver host), so listening on its
    address alone keeps the service off every other interface. A name that
    does not resolve here falls back to all interfaces (the HMAC still guards
    every request).
    """
    try:
        return socket.gethostbyname(host)
    except OSError:
        return ""


def run(fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None,
        num_proc: Optional[int] = None, env: Optional[dict[str, str]] = None,
        spark_context=None, start_timeout: Optional[float] = None,
        timeout: Optional[float] = None, extra_mpi_args: Optional[str] = None,
        executable: Optional[str] = None, stdout: Any = None, stderr: Any = None,
        verbose: Optional[int] = None, prefix_output_with_timestamp: bool = False,
        nics: Any = None) -> list:
    """Runs ``fn(*args, **kwargs)`` on `num_proc` Spark tasks, one hvdkeras rank per task.

    `hvdkeras.init()` has already been called on the ranks' world when `fn`
    starts (calling it again inside `fn` is harmless), so the body is the
    same as for `hvdkeras.run`.

    Args:
        fn: A function cloudpickle can ship; closures are fine.
        args, kwargs: Its arguments.
        num_proc: Number of ranks = Spark tasks (default: the context's
            ``defaultParallelism``); the cluster needs that many free task slots.
        env: Extra environment variables for the ranks (e.g. HVDKERAS_* knobs).
        spark_context: Default: the active SparkContext.
        start_timeout: Seconds for all ranks to start and join (default 300).
        timeout: Seconds for the whole run; then the ranks are ended, the
            Spark job cancelled and RankFailedError raised (default: none).
        extra_mpi_args: More arguments for each task's `mpiexec` (a string,
            split as a shell would).
        executable: The Python the ranks run (default: the task's own).
        stdout, stderr, verbose, prefix_output_with_timestamp: Horovod's
            output options, accepted for its scripts: each rank's lines go,
            prefixed with its rank, to its Spark task's output.
        nics: Not supported (hvdkeras does not pick network interfaces):
            set your MPI's own variable in `env` (MPICH: `FI_TCP_IFACE`).

    Returns:
        The results of all ranks, in rank order.

    Raises:
        RankFailedError: a rank raised (its traceback is in the message) or died.
        ImportError: pyspark is not installed (``pip install "hvdkeras[spark]"``).
    """
    try:
        from pyspark import SparkContext  # lazy: an optional extra (hvdkeras[spark])
    except ImportError as exc:
        raise ImportError(f"hvdkeras.spark needs pyspark: pip install 'hvdkeras[spark]' ({exc})") from exc
    sc = spark_context or SparkContext._active_spark_context
    if sc is None:
        raise ValueError("no active SparkContext: create a SparkSession first "
                         "(SparkSession.builder.getOrCreate()).")
    if nics:
        raise ValueError("hvdkeras.spark.run does not pick network interfaces (nics=); set "
                         "your MPI's interface variable in env= (MPICH: FI_TCP_IFACE).")
    mpi_args = shlex.split(extra_mpi_args or "")
    num_proc = sc.defaultParallelism if num_proc is None else num_proc
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"num_proc must be a whole number >= 1, got {num_proc!r}.")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}.")

    state = _JobState(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))), num_proc)
    secret = new_secret()
    rank_env = dict(env or {})
    if start_timeout is not None:
        rank_env[task_env.START_TIMEOUT_ENV] = str(float(start_timeout))
    group = f"hvdkeras-spark-{uuid.uuid4().hex[:12]}"
    driver_host = _driver_host(sc)
    with Service(secret, state.handle, host=service_bind_address(driver_host),
                 max_connections=4 * num_proc + 16) as service:
        address = f"{driver_host}:{service.port}"
        partition = _make_partition_fn(num_proc, address, secret.hex(), rank_env, executable,
                                       mpi_args)
        finished = threading.Event()

        timed_out = threading.Event()

        def cancel_after_failure():
            if not state.failed.wait(timeout):  # ran past `timeout`
                with state.lock:
                    state.abort_reason = state.abort_reason or f"the run timed out after {timeout:g} s"
                timed_out.set()
                sc.cancelJobGroup(group)
            elif not finished.wait(CANCEL_GRACE_S):
                sc.cancelJobGroup(group)

        watcher = threading.Thread(target=cancel_after_failure, daemon=True)
        watcher.start()
        spark_error = None
        sc.setJobGroup(group, f"hvdkeras.spark.run of {getattr(fn, '__name__', 'fn')} "
                              f"on {num_proc} ranks", interruptOnCancel=True)
        try:
            sc.parallelize(range(num_proc), num_proc).barrier().mapPartitions(partition).collect()
        except Exception as exc:  # Py4JJavaError and friends: explained below when we can
            spark_error = exc
        finally:
            finished.set()
            state.failed.set()  # releases the watcher
            try:
                sc.setLocalProperty("spark.jobGroup.id", None)
            except Exception:  # older pyspark: the group stays set on this thread
                pass
        with state.lock:
            errors = first_failure(state.errors, lambda e: f"{e['message']}\n{e['traceback']}")
            results = dict(state.results)
    if timed_out.is_set():
        raise RankFailedError(f"hvdkeras.spark.run: the run timed out after {timeout:g} s; "
                              "its ranks were ended and the Spark job cancelled")
    if errors:
        # A rank that raised is reported twice: by itself (with its traceback)
        # and by its task (exit code 1); keep the first.
        raised = {e["rank"] for e in errors if e.get("type") != "RankCrashed"}
        errors = [e for e in errors if e.get("type") != "RankCrashed" or e["rank"] not in raised]
        raise_rank_error(errors[0], num_proc)
    if spark_error is not None:
        raise RankFailedError(f"hvdkeras.spark.run: the Spark job failed: {spark_error}") from spark_error
    missing = [r for r in range(num_proc) if r not in results]
    if missing:
        raise RankFailedError(f"hvdkeras.spark.run: ranks {missing} returned no result")
    return [pickle.loads(results[r]) for r in range(num_proc)]

"""`hvdkeras.spark.run`: a function on N Spark tasks (barrier mode), one rank per task.

The ranks form one MPI world as `hvdkeras.cluster.job` describes: a barrier
stage of `num_proc` tasks (Spark starts them together), each running
`run_task_rank`. Here: the Spark stage, the driver's address as the tasks
reach it, and cancelling the Spark job after a failure or a timeout.
"""

from __future__ import annotations

import os
import shlex
import socket
import threading
import uuid
from typing import Any, Callable, Optional, Sequence

import cloudpickle

from hvdkeras.cluster import task_env
from hvdkeras.cluster.job import (CANCEL_GRACE_S, JobState, rank_command, results_or_raise,
                                  run_task_rank)
from hvdkeras.runner.service import Service, new_secret

WHAT = "hvdkeras.spark.run"
DRIVER_HOST_ENV = "HVDKERAS_SPARK_DRIVER_HOST"


def _make_partition_fn(size: int, address: str, secret_hex: str, extra_env: dict,
                       executable: Optional[str] = None,
                       extra_mpi_args: Sequence[str] = ()) -> Callable:
    def partition(_iterator):
        from pyspark import BarrierTaskContext  # lazy: an optional extra (hvdkeras[spark])

        context = BarrierTaskContext.get()
        index = context.partitionId()
        code = run_task_rank(index, size, address, secret_hex, extra_env,
                             rank_command(executable, extra_mpi_args, WHAT), WHAT)
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

    state = JobState(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))), num_proc)
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
    return results_or_raise(state, num_proc, WHAT, engine_error=spark_error,
                            timed_out_after=timeout if timed_out.is_set() else None)

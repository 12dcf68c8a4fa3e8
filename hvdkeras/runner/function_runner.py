"""`hvdkeras.run(fn, ...)` and `Runner(np).run(fn, **kwargs)`: a function on N processes.

`fn` and its arguments are cloudpickled into a fresh temporary directory,
`launch` starts ``python -m hvdkeras.runner.run_task DIR`` on N ranks, `fn`
runs on each (it calls `hvdkeras.init()` itself, like any hvdkeras script),
and the results come back: every rank's from `run` (as `horovod.run`
returns them), rank 0's from `Runner.run` (as HorovodRunner does). An
exception on any rank is raised here as `RankFailedError`, with that rank's
traceback in the message and the original exception as ``__cause__``.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
from typing import Any, Callable, Optional, Sequence

import cloudpickle

from hvdkeras.runner import task_files
from hvdkeras.runner.failures import first_failure
from hvdkeras.runner.launch import launch_job


class RankFailedError(RuntimeError):
    """A rank raised or died.

    Attributes:
        rank: The rank that failed first.
        exception: The exception it raised (None when it did not pickle, or
            when the rank died without one, e.g. a signal).
        remote_traceback: Its formatted traceback ("" when it died).
        exit_code: The job's exit code.
    """

    def __init__(self, message: str, rank: Optional[int] = None,
                 exception: Optional[BaseException] = None, remote_traceback: str = "",
                 exit_code: int = 1) -> None:
        super().__init__(message)
        self.rank = rank
        self.exception = exception
        self.remote_traceback = remote_traceback
        self.exit_code = exit_code


def _pythonpath(extra: Optional[str]) -> str:
    """The caller's sys.path, so that functions pickled by reference import on the ranks."""
    entries = [p for p in sys.path if p and os.path.isdir(p)]
    if extra:
        entries.append(extra)
    return os.pathsep.join(dict.fromkeys(entries))


def _load_errors(task_dir: str) -> list[dict]:
    errors = []
    for name in os.listdir(task_dir):
        if name.startswith("error.") and name.endswith(".pkl"):
            with open(os.path.join(task_dir, name), "rb") as f:
                errors.append(pickle.load(f))
    return first_failure(errors, lambda e: f"{e['message']}\n{e['traceback']}")


def raise_rank_error(error: dict, size: int, exit_code: int = 1) -> None:
    """Raises `RankFailedError` for an error record written by a rank."""
    exception = None
    if error.get("exception") is not None:
        try:
            exception = pickle.loads(error["exception"])
        except Exception:  # a class that is not importable here
            exception = None
    message = (f"rank {error['rank']} of {size} raised {error['type']}: {error['message']}\n\n"
               f"Traceback on rank {error['rank']}:\n{error['traceback'].rstrip()}")
    raise RankFailedError(message, rank=error["rank"], exception=exception,
                          remote_traceback=error["traceback"], exit_code=exit_code) from exception


def _check_horovod_options(use_mpi: Optional[bool], use_gloo: Optional[bool],
                           verbose: Any) -> None:
    """Horovod's transport switches: hvdkeras always runs on MPI."""
    if use_gloo:
        raise ValueError("use_gloo=True: hvdkeras runs on MPI only (no Gloo); drop the "
                         "argument or pass use_mpi=True.")
    if use_mpi is False:
        raise ValueError("use_mpi=False: hvdkeras always runs on MPI; drop the argument.")
    if verbose is not None and (isinstance(verbose, bool) or not isinstance(verbose, int)
                                or verbose < 0):
        raise ValueError(f"verbose must be an integer >= 0, got {verbose!r}.")


def run(fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None, np: int = 2,
        hosts: Optional[str] = None, hostfile: Optional[str] = None,
        env: Optional[dict[str, str]] = None, return_all: bool = True,
        output_dir: Optional[str] = None, prefix_output: bool = True,
        work_dir: Optional[str] = None, timeout: Optional[float] = None,
        min_np: Optional[int] = None, max_np: Optional[int] = None,
        executable: Optional[str] = None, output_filename: Optional[str] = None,
        use_mpi: Optional[bool] = None, use_gloo: Optional[bool] = None,
        verbose: Optional[int] = None) -> Any:
    """Runs ``fn(*args, **kwargs)`` on `np` fresh processes under MPI.

    `horovod.run`'s contract: the result is the list of every rank's return
    value, in rank order.

    Args:
        fn: Any callable cloudpickle can ship (closures and lambdas included).
            It typically calls `hvdkeras.init()` first.
        args: Its positional arguments (pickled once, the same for every
            rank).
        kwargs: Its keyword arguments, likewise.
        np: Number of ranks.
        hosts: As for `launch`.
        hostfile: As for `launch`.
        env: As for `launch`.
        output_dir: As for `launch`.
        prefix_output: As for `launch`.
        return_all: False returns rank 0's result alone.
        work_dir: Where the per-call temporary directory goes (default: the
            system temp dir). Across hosts it must be a path every host sees.
        timeout: Seconds after which every rank is ended and RankFailedError
            raised (default: none).
        min_np: Elastic restarts, as for `launch`.
        max_np: Elastic restarts, as for `launch`.
        executable: The Python interpreter the ranks run (default: this one).
        output_filename: Horovod's name for `output_dir`.
        use_mpi: Horovod's switch; hvdkeras always uses MPI (False is an
            error).
        use_gloo: Horovod's switch; True is an error (no Gloo here).
        verbose: Accepted and unused: a failing rank is always reported.

    Returns:
        Every rank's return value, in rank order (rank 0's with
        ``return_all=False``).

    Raises:
        RankFailedError: a rank raised (its traceback is in the message) or died.
        ValueError: bad arguments (see `launch`).

    Example:

    ```python
    def train(lr):
        import hvdkeras as hvd
        hvd.init()
        return hvd.rank()
    assert hvdkeras.run(train, args=(0.1,), np=2) == [0, 1]
    ```
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}.")
    _check_horovod_options(use_mpi, use_gloo, verbose)
    if output_filename is not None and output_dir is not None:
        raise ValueError("Pass output_dir or Horovod's output_filename, not both.")
    output_dir = output_dir if output_dir is not None else output_filename
    task_dir = tempfile.mkdtemp(prefix="hvdkeras-run-", dir=work_dir)
    try:
        with open(os.path.join(task_dir, task_files.TASK_FILE), "wb") as f:
            cloudpickle.dump((fn, tuple(args), dict(kwargs or {}), bool(return_all)), f)
        rank_env = dict(env or {})
        rank_env["PYTHONPATH"] = _pythonpath(rank_env.get("PYTHONPATH") or os.environ.get("PYTHONPATH"))
        job = launch_job([executable or sys.executable, "-m", "hvdkeras.runner.run_task",
                          task_dir], np,
                         hosts=hosts, hostfile=hostfile, env=rank_env, output_dir=output_dir,
                         prefix_output=prefix_output, timeout=timeout, min_np=min_np,
                         max_np=max_np)
        errors = _load_errors(task_dir)
        if errors:
            raise_rank_error(errors[0], np, job.exit_code or 1)
        if job.exit_code != 0:
            raise RankFailedError(f"hvdkeras.run failed: {job.message or f'exit code {job.exit_code}'}",
                                  rank=_rank_of(job.failure), exit_code=job.exit_code)
        ranks = range(np) if return_all else [0]
        results = []
        for rank in ranks:
            path = task_files.result_path(task_dir, rank)
            if not os.path.exists(path):
                raise RankFailedError(f"rank {rank} finished without writing its result "
                                      f"({path}); did fn end the process itself?", rank=rank)
            with open(path, "rb") as f:
                results.append(pickle.load(f))
        return results if return_all else results[0]
    finally:
        shutil.rmtree(task_dir, ignore_errors=True)


def _rank_of(failure: Optional[dict]) -> Optional[int]:
    try:
        return int(failure["rank"]) if failure else None
    except (KeyError, ValueError):
        return None

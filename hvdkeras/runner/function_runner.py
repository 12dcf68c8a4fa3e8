"""`hvdkeras.run(fn, ...)` and `Runner(np).run(fn, **kwargs)`: a function on N processes.

HorovodRunner's meaning: `fn` and its arguments are cloudpickled into a
fresh temporary directory, `launch` starts ``python -m
hvdkeras.runner.run_task DIR`` on N ranks, `fn` runs on each (it calls
`hvdkeras.init()` itself, like any hvdkeras script), and the results come
back: rank 0's by default, every rank's with ``return_all=True``. An
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


def run(fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None, np: int = 2,
        hosts: Optional[str] = None, hostfile: Optional[str] = None,
        env: Optional[dict[str, str]] = None, return_all: bool = False,
        output_dir: Optional[str] = None, prefix_output: bool = True,
        work_dir: Optional[str] = None, timeout: Optional[float] = None) -> Any:
    """Runs ``fn(*args, **kwargs)`` on `np` fresh processes under MPI.

    Args:
        fn: Any callable cloudpickle can ship (closures and lambdas included).
            It typically calls `hvdkeras.init()` first.
        args, kwargs: Its arguments (pickled once, the same for every rank).
        np: Number of ranks.
        hosts, hostfile, env, output_dir, prefix_output: as for `launch`.
        return_all: Return a list with every rank's result (rank order)
            instead of rank 0's alone.
        work_dir: Where the per-call temporary directory goes (default: the
            system temp dir). Across hosts it must be a path every host sees.
        timeout: Seconds after which every rank is ended and RankFailedError
            raised (default: none).

    Returns:
        Rank 0's return value, or the list of all ranks' with `return_all`.

    Raises:
        RankFailedError: a rank raised (its traceback is in the message) or died.
        ValueError: bad arguments (see `launch`).
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {type(fn).__name__}.")
    task_dir = tempfile.mkdtemp(prefix="hvdkeras-run-", dir=work_dir)
    try:
        with open(os.path.join(task_dir, task_files.TASK_FILE), "wb") as f:
            cloudpickle.dump((fn, tuple(args), dict(kwargs or {}), bool(return_all)), f)
        rank_env = dict(env or {})
        rank_env["PYTHONPATH"] = _pythonpath(rank_env.get("PYTHONPATH") or os.environ.get("PYTHONPATH"))
        job = launch_job([sys.executable, "-m", "hvdkeras.runner.run_task", task_dir], np,
                         hosts=hosts, hostfile=hostfile, env=rank_env, output_dir=output_dir,
                         prefix_output=prefix_output, timeout=timeout)
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


class Runner:
    """HorovodRunner-style front end: ``Runner(np=2).run(fn, **kwargs)``.

    Keyword arguments of the constructor (hosts, hostfile, env, output_dir,
    prefix_output, work_dir, return_all, timeout) are passed on to `run`.
    """

    def __init__(self, np: int = 2, **options: Any) -> None:
        if isinstance(np, bool) or not isinstance(np, int) or np < 1:
            raise ValueError(f"np must be a whole number >= 1, got {np!r}.")
        self.np = np
        self.options = options

    def run(self, fn: Callable, **kwargs: Any) -> Any:
        """Runs ``fn(**kwargs)`` on `np` ranks; returns rank 0's result (see `run`)."""
        return run(fn, kwargs=kwargs, np=self.np, **self.options)

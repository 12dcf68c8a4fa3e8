"""One rank of `hvdkeras.run`: ``python -m hvdkeras.runner.run_task TASK_DIR``.

Loads ``TASK_DIR/task.pkl`` (cloudpickled ``fn, args, kwargs, return_all``),
calls ``fn(*args, **kwargs)`` and writes, atomically, either
``result.<rank>.pkl`` (rank 0 always, the others when all results were
asked for) or ``error.<rank>.pkl`` (the exception when it pickles, its type
name, message and formatted traceback). A failing rank then ends the whole
job with MPI_Abort (Note [abort, not finalize] in hvdkeras/engine/failfast.py):
exiting normally would wait in MPI_Finalize for ranks that may still be
computing.

What may import this module: nothing; ranks run it with ``-m`` (importing it
initializes MPI).
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback

import cloudpickle
from mpi4py import MPI

from hvdkeras.engine import failfast
from hvdkeras.engine.config import EXPECTED_SIZE
from hvdkeras.runner.task_files import TASK_FILE, error_path, error_record, result_path, write_atomic


def _world() -> tuple[int, int]:
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def main(task_dir: str) -> int:
    rank, size = _world()
    try:
        expected = os.environ.get(EXPECTED_SIZE, "").strip()
        if expected.isdigit() and int(expected) != size:
            raise RuntimeError(
                f"launched as one of {expected} ranks but MPI reports a world of size {size}: "
                "the mpiexec belongs to a different MPI than the one mpi4py loads.")
        with open(os.path.join(task_dir, TASK_FILE), "rb") as f:
            fn, args, kwargs, return_all = pickle.load(f)
        result = fn(*args, **kwargs)
        if rank == 0 or return_all:
            write_atomic(result_path(task_dir, rank), cloudpickle.dumps(result))
        return 0
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the caller
        formatted = traceback.format_exc()
        try:
            write_atomic(error_path(task_dir, rank), pickle.dumps(error_record(rank, exc, formatted)))
        finally:
            sys.stderr.write(formatted)
            sys.stderr.flush()
        if failfast.enabled(size):
            MPI.COMM_WORLD.Abort(1)
        return 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m hvdkeras.runner.run_task TASK_DIR")
    sys.exit(main(sys.argv[1]))

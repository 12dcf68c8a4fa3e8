"""MPI job for tests/test_stall.py: one rank withholds named collectives.

    mpiexec -n 3 python stall_job.py warn ERR_DIR
        Rank 1 submits 'fresh_tensor' (never used before) and then
        'cached_tensor' (used 3 times before, so on the fast path) HOLD_S
        late; the others submit at once and wait. Rank 0's engine must warn
        on stderr within HVDKERAS_STALL_CHECK_SECONDS; a timer on rank 0
        checks its own stderr file at the deadline and prints what it saw.
        Every op then completes with the right value.
    mpiexec -n 3 python stall_job.py shutdown ERR_DIR
        Rank 1 never submits 'fresh_withheld' / 'cached_withheld'; the others
        must get an error after HVDKERAS_STALL_SHUTDOWN_SECONDS; the world
        goes on working afterwards.

Each rank's stderr (where the engine writes its warnings) goes to
ERR_DIR/rank<N>.err; results go to ERR_DIR/rank<N>.jsonl (and stdout).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mpi4py import MPI  # noqa: E402

RANK = MPI.COMM_WORLD.Get_rank()
ERR_DIR = sys.argv[2]
_err = os.open(os.path.join(ERR_DIR, f"rank{RANK}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.dup2(_err, 2)  # the engine's fprintf(stderr, ...) lands in this rank's file

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdkeras as hvd  # noqa: E402

WITHHOLDER = 1
CHECK_S = float(os.environ.get("HVDKERAS_STALL_CHECK_SECONDS", "60"))
SHUTDOWN_S = float(os.environ.get("HVDKERAS_STALL_SHUTDOWN_SECONDS", "0"))
SLACK_S = float(os.environ.get("STALL_TEST_SLACK_SECONDS", "2.5"))


def report(**fields) -> None:
    """One JSON line in ERR_DIR/rank<N>.jsonl (stdout lines of ranks can interleave)."""
    line = json.dumps({"rank": RANK, **fields})
    with open(os.path.join(ERR_DIR, f"rank{RANK}.jsonl"), "a") as f:
        f.write(line + "\n")
    print(line, flush=True)


def ones_sum(name: str) -> None:
    got = hvd.allreduce(tf.ones([2]), op=hvd.Sum, name=name).numpy()
    if not np.array_equal(got, np.full(2, hvd.size(), np.float32)):
        raise AssertionError(f"rank {RANK}: {name} = {got}")


def warn_phase(name: str) -> None:
    ones_sum(f"{name}_start")  # line the ranks up
    if RANK == WITHHOLDER:
        time.sleep(CHECK_S + SLACK_S + 1.5)  # past rank 0's deadline check
    elif RANK == 0:
        def check_deadline():
            with open(os.path.join(ERR_DIR, "rank0.err")) as f:
                text = f.read()
            report(phase=name, warned_by_deadline=f"collective '{name}'" in text)
        threading.Timer(CHECK_S + SLACK_S, check_deadline).start()
    start = time.monotonic()
    ones_sum(name)
    report(phase=name, completed=True, seconds=time.monotonic() - start)


def shutdown_phase(name: str) -> None:
    ones_sum(f"{name}_start")
    if RANK == WITHHOLDER:
        time.sleep(SHUTDOWN_S + 2)  # stay alive (and out of the way) until the others failed
    else:
        start = time.monotonic()
        try:
            hvd.allreduce(tf.ones([2]), op=hvd.Sum, name=name).numpy()
            report(phase=name, error=None)
        except tf.errors.OpError as e:
            report(phase=name, error=type(e).__name__, message=e.message,
                   seconds=time.monotonic() - start)
    ones_sum(f"{name}_after")  # the world still works
    report(phase=name, after_ok=True)


def main() -> None:
    mode = sys.argv[1]
    hvd.init()
    for _ in range(3):  # 'cached_*' names are in the response cache from here on
        ones_sum("cached_tensor")
        ones_sum("cached_withheld")
    phase = warn_phase if mode == "warn" else shutdown_phase
    phase("fresh_tensor" if mode == "warn" else "fresh_withheld")
    phase("cached_tensor" if mode == "warn" else "cached_withheld")
    report(done=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

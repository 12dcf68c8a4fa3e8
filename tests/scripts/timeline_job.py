"""MPI job for tests/test_timeline.py: runs named collectives with a timeline.

    mpiexec -n 2 python timeline_job.py env STEPS
        HVDKERAS_TIMELINE (set by the caller) traces the whole run.
    mpiexec -n 2 python timeline_job.py runtime PATH1 PATH2
        No env var: start_timeline(PATH1) / stop_timeline() around some ops,
        then a second trace to PATH2; ops outside the windows must not appear.
    mpiexec -n 2 python timeline_job.py forever STEPS
        Runs STEPS steps (more than the caller waits for) so the caller can
        SIGKILL the job mid-run; prints "step k" now and then.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdkeras as hvd  # noqa: E402


def check(got, want, what):
    got = got.numpy() if hasattr(got, "numpy") else got
    if not np.array_equal(got, want):
        raise AssertionError(f"rank {hvd.rank()}: {what}: got {got}, expected {want}")


def one_step(prefix: str, fused) -> None:
    r, size = hvd.rank(), hvd.size()
    ranks_sum = size * (size + 1) / 2
    check(hvd.allreduce(tf.fill([4], float(r + 1)), op=hvd.Sum, name=f"{prefix}single"),
          np.full(4, ranks_sum, np.float32), "single")
    a, b = hvd.grouped_allreduce([tf.fill([3], float(r + 1)), tf.ones([2, 2])], op=hvd.Sum,
                                 name=f"{prefix}grouped")
    check(a, np.full(3, ranks_sum, np.float32), "grouped a")
    check(hvd.allgather(tf.fill([r + 1, 2], r), name=f"{prefix}gather"),
          np.concatenate([np.full((k + 1, 2), k, np.int32) for k in range(size)]), "gather")
    check(hvd.broadcast(tf.fill([5], r + 7), root_rank=0, name=f"{prefix}bcast"),
          np.full(5, 7, np.int32), "bcast")
    out = hvd.alltoall(tf.fill([size * 2], r), name=f"{prefix}alltoall")
    check(out, np.repeat(np.arange(size, dtype=np.int32), 2), "alltoall")
    hvd.reducescatter(tf.ones([size * 2, 3]), op=hvd.Sum, name=f"{prefix}rs")
    if fused is not None:
        for t in fused():
            check(t, np.full(8, ranks_sum, np.float32), "fused")


def make_fused():
    r = hvd.rank()
    xs = [tf.fill([8], float(r + 1)) for _ in range(4)]

    @tf.function
    def fused():  # four ops ready together: fused into one buffer
        return [hvd.allreduce(x, op=hvd.Sum, name=f"fused_{i}") for i, x in enumerate(xs)]
    return fused


def main() -> None:
    mode = sys.argv[1]
    hvd.init()
    if mode == "env":
        fused = make_fused()
        for _ in range(int(sys.argv[2])):
            one_step("tl_", fused)
    elif mode == "runtime":
        first, second = sys.argv[2], sys.argv[3]
        one_step("off_before_", None)
        hvd.start_timeline(first)  # every rank calls it; only rank 0 writes
        for _ in range(2):
            one_step("on_", None)
        hvd.stop_timeline()
        one_step("off_after_", None)
        hvd.start_timeline(second, mark_cycles=True)
        one_step("second_", None)
        hvd.stop_timeline()
        one_step("off_end_", None)
    elif mode == "forever":
        for k in range(int(sys.argv[2])):
            one_step("kill_", None)
            if k % 10 == 0:
                print(f"rank {hvd.rank()} step {k}", flush=True)
            time.sleep(0.005)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"rank {hvd.rank()} done", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

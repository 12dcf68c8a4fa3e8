"""MPI job for tests/test_autotune.py: many allreduce ops until autotune finishes.

    mpiexec -n 2 python autotune_job.py OUT_DIR

HVDKERAS_AUTOTUNE=1 and HVDKERAS_AUTOTUNE_LOG are set by the caller. Every
rank runs the same number of steps: after each chunk of CHUNK steps, rank 0
decides from the log whether tuning has finished and broadcasts the decision
(never a local time-based loop, which would let ranks diverge). Then every
rank writes its engine_config() to OUT_DIR/rank<N>.json.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hvdkeras as hvd  # noqa: E402

NUM_TENSORS = 32
ELEMENTS = 16 * 1024  # 64 KiB of float32 each: 2 MiB a step
CHUNK = 10
# A backstop only: the caller's timeout is the real limit. Tuning is timed
# (each trial lasts a few 0.25 s windows), so the number of steps it needs
# grows with the machine's speed: ~32,000 at 0.5 ms a step.
MAX_CHUNKS = 1_000_000


def tuning_finished(log_path: str) -> bool:
    try:
        with open(log_path) as f:
            return any(line.startswith("final,") for line in f)
    except FileNotFoundError:
        return False


def main() -> None:
    out_dir = sys.argv[1]
    log_path = os.environ["HVDKERAS_AUTOTUNE_LOG"]
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    xs = [tf.constant(np.full(ELEMENTS, rank + 1 + i, np.float32)) for i in range(NUM_TENSORS)]
    want = [np.full(ELEMENTS, sum(r + 1 + i for r in range(size)), np.float32)
            for i in range(NUM_TENSORS)]

    @tf.function
    def step():
        return [hvd.allreduce(x, op=hvd.Sum, name=f"tune_{i}") for i, x in enumerate(xs)]

    steps = 0
    for _ in range(MAX_CHUNKS):
        for _ in range(CHUNK):
            got = step()
            steps += 1
        for g, w in zip(got, want):  # the values stay right whatever the parameters
            if not np.array_equal(g.numpy(), w):
                raise AssertionError(f"rank {rank}: wrong allreduce result at step {steps}")
        done = int(rank == 0 and tuning_finished(log_path))
        if hvd.broadcast(tf.constant(done), root_rank=0, name="tune_done").numpy():
            break
    step()  # one more cycle with data after the final row (the values are agreed by now)
    hvd.barrier()
    config = hvd.engine_config()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "steps": steps, "fusion_threshold": config.fusion_threshold,
                   "cycle_time_ms": config.cycle_time_ms, "autotune": config.autotune}, f)
    print(f"rank {rank} done after {steps} steps", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()

"""Allreduce throughput of hvdkeras against raw mpi4py, measured in one job.

Run with two ranks:

    mpiexec -n 2 python examples/allreduce_benchmark.py

For each total size (4 KB, 256 KB, 4 MB, 64 MB of float32) it times
  (a) one tensor holding all the bytes,
  (b) 100 tensors in one `grouped_allreduce`,
  (c) 100 separate `allreduce` ops inside one `tf.function`,
and, as the floor, mpi4py's `comm.Allreduce` of one contiguous buffer of the
same bytes. It prints the median time per call, the bus bandwidth
(2 (n-1)/n * bytes / time, the convention of nccl-tests) and the ratio of
each case to the raw floor. Rank 0 prints; times are the slowest rank's
median.

The "TF only" column times the same tf.function with each collective
replaced by a local multiply that allocates and writes outputs of the same
sizes: the part of each case that TensorFlow itself costs (function call,
fresh output buffers), which no communication library can remove.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import hvdkeras as hvd  # noqa: E402

SIZES = {"4KB": 4 << 10, "256KB": 256 << 10, "4MB": 4 << 20, "64MB": 64 << 20}
NUM_TENSORS = 100


def iterations_for(total_bytes: int, scale: float) -> int:
    if total_bytes >= 32 << 20:
        n = 15
    elif total_bytes >= 1 << 20:
        n = 60
    else:
        n = 300
    return max(5, int(n * scale))


def time_calls(fn, iterations: int, comm) -> float:
    """Median seconds per call of fn(), each call started together on all ranks."""
    for _ in range(3):  # warm up: traces, negotiation, cache fill
        fn()
    samples = []
    for _ in range(iterations):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    local = statistics.median(samples)
    return comm.allreduce(local, op=MPI.MAX)


def make_cases(total_bytes: int, comm):
    rank = comm.Get_rank()
    elements = total_bytes // 4
    one = tf.constant(np.full(elements, rank + 1, np.float32))
    per = elements // NUM_TENSORS
    many = [tf.constant(np.full(per, rank + 1, np.float32)) for _ in range(NUM_TENSORS)]

    @tf.function
    def single():
        return hvd.allreduce(one, op=hvd.Sum, name="bench_single")

    @tf.function
    def grouped():
        return hvd.grouped_allreduce(many, op=hvd.Sum, name="bench_grouped")

    @tf.function
    def separate():
        return [hvd.allreduce(t, op=hvd.Sum, name=f"bench_sep_{i}") for i, t in enumerate(many)]

    @tf.function
    def single_local():
        return one * 2.0  # (* 1.0 would be optimised away)

    @tf.function
    def many_local():
        return [t * 2.0 for t in many]

    send = np.full(elements, rank + 1, np.float32)
    recv = np.empty_like(send)

    def raw():
        comm.Allreduce(send, recv, op=MPI.SUM)

    return raw, {"(a) one tensor": (single, single_local),
                 "(b) grouped x100": (grouped, many_local),
                 "(c) separate x100": (separate, many_local)}


def steady_state(label: str, warm_steps: int, comm) -> None:
    """Times case (c) after a fixed number of warm-up steps (the same on every rank)."""
    _, cases = make_cases(SIZES[label], comm)
    separate = cases["(c) separate x100"][0]
    for _ in range(warm_steps):
        separate()
    seconds = time_calls(separate, iterations_for(SIZES[label], 1.0), comm)
    if comm.Get_rank() == 0:
        cfg = hvd.engine_config()
        print(f"steady state, {label} as 100 separate allreduces: median {seconds * 1e3:.3f} ms "
              f"(autotune {'on' if cfg.autotune else 'off'}; fusion threshold "
              f"{cfg.fusion_threshold} B, cycle time {cfg.cycle_time_ms} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated subset of "
                        + ", ".join(SIZES))
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies the number of timed iterations")
    parser.add_argument("--steady", metavar="SIZE", default=None,
                        help="instead of the table: run case (c) at SIZE for --warm-steps "
                             "steps (autotune tunes during them when HVDKERAS_AUTOTUNE=1), "
                             "then time it; compare runs with and without autotune")
    parser.add_argument("--warm-steps", type=int, default=3000)
    args = parser.parse_args()

    hvd.init()
    comm = MPI.COMM_WORLD
    if args.steady:
        steady_state(args.steady, args.warm_steps, comm)
        hvd.shutdown()
        return
    n = comm.Get_size()
    rows = []
    for label in args.sizes.split(","):
        total = SIZES[label]
        raw, cases = make_cases(total, comm)
        iterations = iterations_for(total, args.scale)
        floor = time_calls(raw, iterations, comm)
        rows.append((label, "raw mpi4py Allreduce", floor, total, 1.0, float("nan")))
        for name, (fn, local_fn) in cases.items():
            seconds = time_calls(fn, iterations, comm)
            local = time_calls(local_fn, iterations, comm)
            rows.append((label, name, seconds, total, seconds / floor, local))
    if comm.Get_rank() == 0:
        cfg = hvd.engine_config()
        print(f"hvdkeras allreduce benchmark: {n} ranks, float32, op=Sum, "
              f"fusion threshold {cfg.fusion_threshold >> 20} MiB, cycle time "
              f"{cfg.cycle_time_ms} ms")
        print(f"{'size':>6}  {'case':<22} {'median ms':>10} {'busbw GB/s':>11} {'x raw':>7} "
              f"{'TF only ms':>11}")
        for label, name, seconds, total, ratio, local in rows:
            busbw = 2 * (n - 1) / n * total / seconds / 1e9 if n > 1 else float("nan")
            local_text = "" if local != local else f"{local * 1e3:>11.3f}"
            print(f"{label:>6}  {name:<22} {seconds * 1e3:>10.3f} {busbw:>11.2f} {ratio:>7.2f} "
                  f"{local_text}")
    hvd.shutdown()


if __name__ == "__main__":
    main()

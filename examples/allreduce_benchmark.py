"""Allreduce throughput of hvdkeras against raw mpi4py, measured in one job.

Run with two ranks:

    mpiexec -n 2 python examples/allreduce_benchmark.py

For each total size (4 KB, 256 KB, 4 MB, 64 MB of float32) it times
  (a) one tensor holding all the bytes,
  (b) 100 tensors in one `grouped_allreduce`,
  (c) 100 separate `allreduce` ops inside one `tf.function`,
and, as the floor, mpi4py's `comm.Allreduce` of one contiguous buffer of the
same bytes (timed before and after the cases; the faster counts). It
prints the median time per call, the bus bandwidth (2 (n-1)/n * bytes /
time, the convention of nccl-tests) and the ratio of each case to the raw
floor. Rank 0 prints; times are the slowest rank's median.

Each case is shaped like a training step: the tensors are born inside the
function (views of one buffer, as gradients come out of back-propagation)
and their results are used inside it. `--boundary` instead passes 100
captured tensors in and returns 100 results to Python, which adds what
TensorFlow charges per tensor crossing a function boundary.

The "TF only" column times the same tf.function with each collective
replaced by a local multiply that writes outputs of the same sizes: what
TensorFlow itself costs (function call, outputs), which no communication
library can remove. Last, for the first size, case (c) and its TF-only twin
run in turn call by call (`--pairs` of them), and the distribution of the
difference is printed: what 100 separate collectives add to a step (and, for
comparison, what one group of the same tensors and one tensor add).
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


def tensor_elements(total_bytes: int) -> int:
    """float32 elements per tensor: a 100th of the total, in whole 64-byte lines
    above 64 bytes (so the in-graph views stay aligned; at most 0.01% fewer bytes)."""
    per = total_bytes // 4 // NUM_TENSORS
    return per - per % 16 if per >= 16 else per


def iterations_for(total_bytes: int, scale: float) -> int:
    if total_bytes >= 32 << 20:
        n = 30
    elif total_bytes >= 1 << 20:
        n = 200
    else:
        n = 400
    return max(5, int(n * scale))


def time_interleaved(fns, iterations: int, comm) -> list:
    """Median seconds per call of each function (the slowest rank's median).

    The functions take turns within every iteration, so they see the same
    state of a noisy machine. Each call starts together on all ranks.
    """
    for _ in range(3):  # warm up: traces, negotiation, cache fill
        for fn in fns:
            fn()
    samples = [[] for _ in fns]
    for _ in range(iterations):
        for fn, times in zip(fns, samples):
            comm.Barrier()
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [comm.allreduce(statistics.median(times), op=MPI.MAX) for times in samples]


def time_calls(fn, iterations: int, comm) -> float:
    return time_interleaved([fn], iterations, comm)[0]


def make_cases(total_bytes: int, comm, boundary: bool = False):
    """(raw floor, {case: (hvdkeras fn, TF-only fn)}) for one total size.

    By default each case looks like a training step: the tensors are born
    inside the function (views of one captured buffer, as gradients come out
    of back-propagation) and the results are consumed inside it (the function
    waits for them and returns a scalar). With `boundary=True` the tensors are
    captured one by one and all results are returned to Python, which adds
    TensorFlow's cost of passing 100 tensors across the function boundary.
    """
    rank = comm.Get_rank()
    per = tensor_elements(total_bytes)
    rows = tf.constant(np.full([NUM_TENSORS, per], rank + 1, np.float32))
    base = tf.reshape(rows, [-1])
    captured = [tf.constant(np.full(per, rank + 1, np.float32)) for _ in range(NUM_TENSORS)]

    def inputs(many: bool):
        if not many:
            return base
        if boundary:
            return captured
        # Rows whose size is a multiple of 64 bytes unstack into views, not copies.
        return tf.unstack(rows)

    def finish(outputs):
        if boundary:
            return outputs
        with tf.control_dependencies(tf.nest.flatten(outputs)):
            return tf.constant(0.0)

    @tf.function
    def single():
        return finish(hvd.allreduce(inputs(False), op=hvd.Sum, name="bench_single"))

    @tf.function
    def grouped():
        return finish(hvd.grouped_allreduce(inputs(True), op=hvd.Sum, name="bench_grouped"))

    @tf.function
    def separate():
        return finish([hvd.allreduce(t, op=hvd.Sum, name=f"bench_sep_{i}")
                       for i, t in enumerate(inputs(True))])

    @tf.function
    def single_local():
        return finish(inputs(False) * 2.0)  # (* 1.0 would be optimised away)

    @tf.function
    def many_local():
        return finish([t * 2.0 for t in inputs(True)])

    send = np.full(per * NUM_TENSORS, rank + 1, np.float32)  # the bytes the cases move
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


RAW = "raw mpi4py Allreduce"
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)


def paired_overhead(label: str, case: str, iterations: int, comm, boundary: bool) -> np.ndarray:
    """Per step, what `case` costs above its TF-only twin: the two run in
    turn, call by call, and each pair's difference is the slowest rank's."""
    _, cases = make_cases(SIZES[label], comm, boundary)
    collective, local = cases[case]
    tf.config.optimizer.set_experimental_options({"dependency_optimization": False})
    local()  # traced with the pass off, as in measure_size
    tf.config.optimizer.set_experimental_options({"dependency_optimization": True})
    for _ in range(20):
        collective()
        local()
    diffs = np.empty(iterations)
    for k in range(iterations):
        seconds = []
        for fn in (collective, local):
            comm.Barrier()
            start = time.perf_counter()
            fn()
            seconds.append(time.perf_counter() - start)
        diffs[k] = seconds[0] - seconds[1]
    slowest = np.empty_like(diffs)
    comm.Allreduce(diffs, slowest, op=MPI.MAX)
    return slowest


def measure_size(label: str, args, comm) -> dict:
    """One pass over one size: {(label, case): (seconds, ratio to raw, TF-only seconds)}."""
    total = SIZES[label]
    raw, cases = make_cases(total, comm, args.boundary)
    iterations = iterations_for(total, args.scale)
    # Grappler turns ops whose results are only waited on into no-ops; the
    # TF-only functions consume their results that way, so they run with
    # that pass off (hvdkeras ops are stateful and never pruned).
    tf.config.optimizer.set_experimental_options({"dependency_optimization": False})
    local = time_interleaved([local_fn for _, local_fn in cases.values()], iterations, comm)
    tf.config.optimizer.set_experimental_options({"dependency_optimization": True})
    # The floor is timed in a tight loop of its own, before and after the
    # cases, and the faster of the two counts (the stricter comparison).
    floor = time_calls(raw, iterations, comm)
    seconds = [time_calls(fn, iterations, comm) for fn, _ in cases.values()]
    floor = min(floor, time_calls(raw, iterations, comm))
    out = {(label, RAW): (floor, 1.0, float("nan"))}
    for name, case_seconds, local_seconds in zip(cases, seconds, local):
        out[(label, name)] = (case_seconds, case_seconds / floor, local_seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated subset of "
                        + ", ".join(SIZES))
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies the number of timed iterations")
    parser.add_argument("--repeat", type=int, default=3,
                        help="passes over all sizes; the table shows medians over passes "
                             "(this VM's speed drifts by up to 2x between seconds)")
    parser.add_argument("--steady", metavar="SIZE", default=None,
                        help="instead of the table: run case (c) at SIZE for --warm-steps "
                             "steps (autotune tunes during them when HVDKERAS_AUTOTUNE=1), "
                             "then time it; compare runs with and without autotune")
    parser.add_argument("--warm-steps", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=2000,
                        help="interleaved pairs of each case and its TF-only twin for the "
                             "distribution of what it adds per step (0: skip it)")
    parser.add_argument("--boundary", action="store_true",
                        help="pass the 100 tensors into the function as captures and return "
                             "every result to Python (adds TensorFlow's per-tensor call cost)")
    args = parser.parse_args()

    hvd.init()
    comm = MPI.COMM_WORLD
    if args.steady:
        steady_state(args.steady, args.warm_steps, comm)
        hvd.shutdown()
        return
    n = comm.Get_size()
    labels = args.sizes.split(",")
    results: dict = {}  # (label, case) -> per-pass (seconds, ratio, TF-only seconds)
    sizes = {}
    for _ in range(args.repeat):
        for label in labels:
            for key, value in measure_size(label, args, comm).items():
                results.setdefault(key, []).append(value)
            sizes[label] = tensor_elements(SIZES[label]) * NUM_TENSORS * 4
    if comm.Get_rank() == 0:
        cfg = hvd.engine_config()
        print(f"hvdkeras allreduce benchmark: {n} ranks, float32, op=Sum, "
              f"fusion threshold {cfg.fusion_threshold >> 20} MiB, cycle time "
              f"{cfg.cycle_time_ms} ms, {args.repeat} passes (medians; x raw range "
              f"over passes)")
        print(f"{'size':>6}  {'case':<22} {'median ms':>10} {'busbw GB/s':>11} {'x raw':>7} "
              f"{'x raw range':>12} {'TF only ms':>11}")
        for (label, name), passes in results.items():
            seconds = statistics.median(p[0] for p in passes)
            ratios = [p[1] for p in passes]
            local = statistics.median(p[2] for p in passes)
            busbw = 2 * (n - 1) / n * sizes[label] / seconds / 1e9 if n > 1 else float("nan")
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if name != RAW else ""
            local_text = "" if local != local else f"{local * 1e3:>11.3f}"
            print(f"{label:>6}  {name:<22} {seconds * 1e3:>10.3f} {busbw:>11.2f} "
                  f"{statistics.median(ratios):>7.2f} {spread:>12} {local_text}")
    if args.pairs > 0:
        label = labels[0]
        # (c) is the figure of interest; (a) and (b) show what one collective
        # and one group of the same tensors add on the same machine state.
        for case in ("(c) separate x100", "(b) grouped x100", "(a) one tensor"):
            added = paired_overhead(label, case, args.pairs, comm, args.boundary)
            if comm.Get_rank() == 0:
                points = "  ".join(f"p{int(q * 100)} {np.quantile(added, q) * 1e3:.3f}"
                                   for q in QUANTILES)
                print(f"{case} at {label}, ms above TF alone per step over {args.pairs} "
                      f"interleaved pairs: {points}")
    hvd.shutdown()


if __name__ == "__main__":
    main()

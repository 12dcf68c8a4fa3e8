#!/usr/bin/env python3
"""Synthetic-data throughput of a keras.applications model through model.fit.

    hvdkerasrun -np 2 python examples/synthetic_benchmark.py --model ResNet50 --image-size 64
    python examples/synthetic_benchmark.py --scaling 2 --model ResNet50 --image-size 64
    python examples/synthetic_benchmark.py --lab bench --rates 1,2 --peer --image-size 64 --batch-size 8

Under a launcher it prints images/s per rank and in total, each iteration
and then as mean +- 1.96 standard deviations (the format of Horovod's
synthetic benchmark). `--scaling N` measures, in one invocation and one after
the other: 1 rank, N ranks, and N independent single processes running at
the same time without hvdkeras (the no-communication ceiling on this
machine), and prints the scaling efficiency (N ranks / N independent), the
gradient bytes each step reduces, the time a raw in-place MPI_Allreduce of
those bytes takes (the floor), and where an N-rank step's time goes, from
the engine's timeline: waiting for the other ranks, the collectives
themselves, and the rest (compute not hidden behind them). `--lab NAME`
runs one rank per host of a network-namespace lab at unshaped and shaped
links, against PyTorch DDP with `--peer` (examples/lab_steps.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

from hvdkeras.report.timeline_phases import union_ms

HERE = os.path.abspath(__file__)


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ResNet50", help="a keras.applications model")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--num-warmup-batches", type=int, default=5)
    p.add_argument("--num-batches-per-iter", type=int, default=10)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--jit", action="store_true", help="compile(jit_compile=True)")
    p.add_argument("--fp16-allreduce", action="store_true")
    p.add_argument("--num-groups", type=int, default=0,
                   help="DistributedOptimizer(num_groups=...): gradient groups reduced separately")
    p.add_argument("--scaling", type=int, default=0, metavar="N",
                   help="measure 1 rank, N ranks and N independent processes")
    p.add_argument("--lab", default="", help="lab mode on this network-namespace lab "
                   "(scripts/netlab.py; see examples/lab_steps.py)")
    p.add_argument("--rates", default="1,2", help="lab mode: link rates in Gbit/s")
    p.add_argument("--models", default="", help="lab mode: models, comma-separated "
                   "(default: --model)")
    p.add_argument("--lab-hosts", type=int, default=2, help="lab mode: hosts, one rank each")
    p.add_argument("--peer", action="store_true", help="lab mode: PyTorch DDP (gloo) on a "
                   "ResNet-50 of the same layout, for the ResNet50 rows")
    p.add_argument("--picture", default="", help="lab mode: draw one step of the first "
                   "rate's run into this PNG")
    p.add_argument("--skip-floor", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--independent", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    p.add_argument("--timeline", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def interval(values: List[float]) -> str:
    mean = statistics.mean(values)
    spread = 1.96 * statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.1f} +-{spread:.1f}"


def run_worker(args: argparse.Namespace) -> None:
    import keras
    import numpy as np
    import tensorflow as tf

    if args.independent:  # plain Keras: the no-communication ceiling
        rank, size = 0, 1
    else:
        import hvdkeras as hvd
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    model = getattr(keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3), classes=1000)
    optimizer = keras.optimizers.SGD(0.01)
    callbacks: list = []
    if not args.independent:
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer, compression=compression,
                                             num_groups=args.num_groups)
        callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy",
                  jit_compile=args.jit)
    images = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3])
    labels = tf.random.uniform([args.batch_size], maxval=1000, dtype=tf.int64)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()

    timings: List[float] = []

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            timings.append(time.perf_counter() - self.start)

    model.fit(data, steps_per_epoch=args.num_warmup_batches, epochs=1, verbose=0,
              callbacks=callbacks)
    if args.timeline and not args.independent:
        hvd.start_timeline(args.timeline)
    model.fit(data, steps_per_epoch=args.num_batches_per_iter, epochs=args.num_iters,
              verbose=0, callbacks=[Timer()])
    if args.timeline and not args.independent:
        hvd.stop_timeline()
    per_rank = [args.batch_size * args.num_batches_per_iter / t for t in timings]
    gradient_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                         for v in model.trainable_variables)
    floor_ms = raw_allreduce_ms(gradient_bytes) if size > 1 and not args.skip_floor else 0.0
    if rank == 0:
        for i, value in enumerate(per_rank):
            print(f"Iter #{i}: {value:.1f} img/sec per rank")
        print(f"Img/sec per rank: {interval(per_rank)}")
        print(f"Total img/sec on {size} rank(s): {interval([v * size for v in per_rank])}")
    if args.json and rank == 0:
        with open(args.json, "w") as f:
            json.dump({"per_rank": per_rank, "size": size, "gradient_bytes": gradient_bytes,
                       "floor_ms": floor_ms,
                       "step_ms": 1000 * statistics.mean(timings) / args.num_batches_per_iter},
                      f)


def raw_allreduce_ms(total_bytes: int, repeats: int = 10) -> float:
    """Median time of one in-place MPI_Allreduce of `total_bytes` of float32 (mpi4py)."""
    import numpy as np
    from mpi4py import MPI

    buffer = np.ones(total_bytes // 4, np.float32)
    times = []
    for _ in range(repeats + 2):
        MPI.COMM_WORLD.Barrier()
        start = time.perf_counter()
        MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[2:])


def timeline_breakdown(path: str) -> Dict[str, float]:
    """Milliseconds spent negotiating (waiting for ranks) and executing
    collectives over a trace, from its top-level events per tensor."""
    with open(path) as f:
        events = json.load(f)
    stacks: Dict[int, list] = {}
    negotiate, execute = [], []
    for e in events:
        if e.get("ph") == "B":
            stacks.setdefault(e["pid"], []).append(e)
        elif e.get("ph") == "E" and stacks.get(e["pid"]):
            begin = stacks[e["pid"]].pop()
            if stacks[e["pid"]]:
                continue  # a phase inside an op
            target = negotiate if begin["name"].startswith("NEGOTIATE") else execute
            target.append((begin["ts"], e["ts"]))
    both = negotiate + execute
    span = (max(t for _, t in both) - min(s for s, _ in both)) / 1000.0 if both else 0.0
    return {"negotiate_ms": union_ms(negotiate), "execute_ms": union_ms(execute),
            "busy_ms": union_ms(both), "span_ms": span}


def timeline_overlap(path: str, pattern: str = r"gradients(_bucket)?(_\d+)?$"
                     ) -> Dict[str, float]:
    """How far the gradient reductions overlap the backward pass, per step.

    The gradient group submitted last holds the first layers' gradients, the
    last ones back-propagation computes, so its submission marks the end of
    the backward pass. A step overlaps when the first group's reduction
    starts before that: `lead_ms` (median over steps) is by how much, and
    `overlapped` the fraction of steps where it does. Gradient groups are the
    ops whose names match `pattern` (DistributedOptimizer names them
    "<optimizer>_gradients_<group>", or "_bucket_<bucket>" across hosts).
    """
    with open(path) as f:
        events = json.load(f)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    submitted: Dict[str, List[float]] = {}
    started: Dict[str, List[float]] = {}
    depth: Dict[int, int] = {}
    for e in events:
        name = names.get(e.get("pid"), "")
        if not re.search(pattern, name) or e.get("ph") not in ("B", "E"):
            continue
        if e["ph"] == "E":
            depth[e["pid"]] = depth.get(e["pid"], 1) - 1
            continue
        if depth.get(e["pid"], 0) == 0:
            target = submitted if e["name"].startswith("NEGOTIATE") else started
            target.setdefault(name, []).append(e["ts"])
        depth[e["pid"]] = depth.get(e["pid"], 0) + 1
    groups = sorted(set(submitted) & set(started))
    steps = min((min(len(submitted[g]), len(started[g])) for g in groups), default=0)
    leads = [(max(submitted[g][k] for g in groups) - min(started[g][k] for g in groups)) / 1000.0
             for k in range(steps)]
    if not leads:
        return {"groups": len(groups), "lead_ms": 0.0, "overlapped": 0.0}
    return {"groups": len(groups), "lead_ms": statistics.median(leads),
            "overlapped": sum(1 for x in leads if x > 0) / len(leads)}


def run_scaling(args: argparse.Namespace, argv: List[str], work: str) -> None:
    n = args.scaling
    passthrough = list(argv)
    at = next(i for i, a in enumerate(passthrough) if a.startswith("--scaling"))
    del passthrough[at:at + (1 if "=" in passthrough[at] else 2)]
    cores = os.cpu_count() or 1

    def launch(np_: int, tag: str, extra: List[str]) -> dict:
        out = os.path.join(work, f"{tag}.json")
        subprocess.run(["hvdkerasrun", "-np", str(np_), sys.executable, HERE, *passthrough,
                        "--json", out, *extra], check=True)
        with open(out) as f:
            return json.load(f)

    single = launch(1, "np1", [])
    timeline = os.path.join(work, "timeline.json")
    ranks = launch(n, f"np{n}", ["--timeline", timeline])
    env = dict(os.environ, TF_NUM_INTRAOP_THREADS=str(max(1, cores // n)),
               TF_NUM_INTEROP_THREADS=str(max(1, cores // n)))
    procs = [subprocess.Popen([sys.executable, HERE, *passthrough, "--independent", "--json",
                               os.path.join(work, f"independent{i}.json")], env=env)
             for i in range(n)]
    if any(p.wait() for p in procs):
        raise SystemExit("an independent process failed")
    independent = []
    for i in range(n):
        with open(os.path.join(work, f"independent{i}.json")) as f:
            independent.append(json.load(f))
    total = {"np1": statistics.mean(single["per_rank"]),
             f"np{n}": n * statistics.mean(ranks["per_rank"]),
             "independent": sum(statistics.mean(r["per_rank"]) for r in independent)}
    print(f"\n{args.model} {args.image_size}px, batch {args.batch_size} per rank, "
          f"jit {'on' if args.jit else 'off'}, {cores} cores")
    print("| run | total img/s | per rank |")
    print("|---|---|---|")
    print(f"| 1 rank | {total['np1']:.1f} | {total['np1']:.1f} |")
    print(f"| {n} ranks | {total[f'np{n}']:.1f} | {total[f'np{n}'] / n:.1f} |")
    print(f"| {n} independent processes | {total['independent']:.1f} | "
          f"{total['independent'] / n:.1f} |")
    print(f"scaling efficiency ({n} ranks / {n} independent): "
          f"{100 * total[f'np{n}'] / total['independent']:.1f}%")
    print(f"gradient bytes per step: {ranks['gradient_bytes'] / 2**20:.1f} MiB; raw in-place "
          f"MPI_Allreduce of them: {ranks['floor_ms']:.1f} ms; step: {ranks['step_ms']:.1f} ms")
    if os.path.exists(timeline):
        b = timeline_breakdown(timeline)
        steps = args.num_iters * args.num_batches_per_iter
        print(f"per step (rank 0's timeline): waiting for ranks "
              f"{b['negotiate_ms'] / steps:.1f} ms, collectives {b['execute_ms'] / steps:.1f} ms, "
              f"rest (compute not hidden by them) "
              f"{ranks['step_ms'] - b['busy_ms'] / steps:.1f} ms")
        o = timeline_overlap(timeline)
        if o["groups"] > 1:
            print(f"overlap with the backward pass ({o['groups']} gradient groups): the first "
                  f"reduction starts {o['lead_ms']:.1f} ms (median) before the last group is "
                  f"submitted, in {100 * o['overlapped']:.0f}% of steps")
        else:
            print("overlap with the backward pass: none (one gradient group waits for every "
                  "gradient; --num-groups splits it)")


def lab_passthrough(args: argparse.Namespace) -> List[str]:
    """The worker's arguments for a lab-mode job (without --model). Pure."""
    out = ["--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
           "--num-warmup-batches", str(args.num_warmup_batches),
           "--num-batches-per-iter", str(args.num_batches_per_iter),
           "--num-iters", str(args.num_iters), "--num-groups", str(args.num_groups),
           "--skip-floor"]
    return out + (["--jit"] if args.jit else []) + (["--fp16-allreduce"] if args.fp16_allreduce
                                                    else [])


def main(argv: List[str]) -> None:
    args = parse_args(argv)
    if args.lab:
        sys.path.insert(0, os.path.dirname(HERE))  # deliberate: its neighbour, as a script
        import lab_steps  # lazy: the lab mode's orchestration, only with --lab

        lab_steps.run_lab(args, lab_passthrough(args))
    elif args.scaling:
        work = tempfile.mkdtemp(prefix="synthetic-benchmark-")
        try:
            run_scaling(args, argv, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        run_worker(args)


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""Memory and step time of sharding (zero_stage 0 to 3).

    python examples/zero_benchmark.py --model ResNet50 --image-size 64 --ranks 2,4,8
    python examples/zero_benchmark.py --model MLP --ranks 4    # 96-512-384-10
    python examples/zero_benchmark.py --model Embedding --ranks 4   # a 50000x64 table
    python examples/zero_benchmark.py --model Wide340M --ranks 1,4 --stages 0,3 --steps 10
    KERAS_BACKEND=torch python examples/zero_benchmark.py --ranks 2   # or jax
    sudo python scripts/netlab.py --name zero up --hosts 2 --rate 1gbit
    KERAS_BACKEND=torch python examples/zero_benchmark.py --lab zero --ranks 2 --stages 0,3

For each rank count and each stage it launches one job (hvdkerasrun), trains
the model through model.fit on synthetic data with Adam, and prints one
table: optimizer-state and weight bytes held on the fullest rank (against
stage 0 and the 1/N ideal), the largest peak RSS over the ranks, and the
median step time with its ratio to stage 0 at the same rank count; then
each run's losses per step (every run starts from the same seeded weights
and every rank trains on the same batch, so the losses of N ranks are one
process's on that batch). Step times are measured at
every rank count but mean something only where each rank has a core of its
own (`--timed-ranks`, default 2); elsewhere the row says "oversubscribed".
With `--lab NAME` each rank runs on a host of its own of the network-namespace
lab NAME (scripts/netlab.py), so the gathers cross its links.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List

HERE = os.path.abspath(__file__)


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="ResNet50",
                   help="a keras.applications model, MLP (96-512-384-10, one kernel 78%% of "
                        "the parameters) or Embedding (a 50000x64 table and a classifier)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--ranks", default="2,4,8", help="rank counts, comma-separated")
    p.add_argument("--stages", default=None,
                   help="zero stages, comma-separated (default 0,1,2,3)")
    p.add_argument("--timed-ranks", type=int, default=2,
                   help="the rank count whose step times are reported")
    p.add_argument("--warmup", type=int, default=3, help="steps before timing")
    p.add_argument("--steps", type=int, default=12, help="timed steps (at --timed-ranks)")
    p.add_argument("--rounds", type=int, default=2,
                   help="at --timed-ranks, run the stages this many times, interleaved, "
                        "and report the median of the rounds")
    p.add_argument("--lab", default=None,
                   help="run one rank on each host of this network-namespace lab "
                        "(scripts/netlab.py)")
    p.add_argument("--stage", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def peak_rss_bytes() -> int:
    """This process's peak resident set size (VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# The models that are not keras.applications ones: builder, input shape
# (after the batch), input kind, classes.
VOCABULARY = 50_000
OWN_MODELS = {
    "MLP": (lambda keras: keras.Sequential([
        keras.Input((96,)), keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(384, activation="relu"), keras.layers.Dense(10)]), (96,), "float", 10),
    "Embedding": (lambda keras: keras.Sequential([
        keras.Input((32,), dtype="int32"), keras.layers.Embedding(VOCABULARY, 64),
        keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10)]), (32,), "int", 10),
    # About 336M parameters: fp32 weights, gradients and Adam's moments take
    # 5.4 GB per replica, so four stage-0 replicas do not fit 24 GiB.
    "Wide340M": (lambda keras: keras.Sequential(
        [keras.Input((4096,))] + [keras.layers.Dense(4096, activation="relu")
                                  for _ in range(20)] + [keras.layers.Dense(10)]),
        (4096,), "float", 10),
}


def build_model(args: argparse.Namespace):
    """The model, its input shape (after the batch), input kind and classes."""
    import keras

    if args.model in OWN_MODELS:
        make, shape, kind, classes = OWN_MODELS[args.model]
        return make(keras), shape, kind, classes
    model = getattr(keras.applications, args.model)(
        weights=None, input_shape=(args.image_size, args.image_size, 3), classes=1000)
    return model, (args.image_size, args.image_size, 3), "float", 1000


def synthetic_batches(args: argparse.Namespace, shape, kind: str, classes: int):
    """One random batch, repeated: a tf.data pipeline under TensorFlow, a
    Python generator of NumPy arrays under Keras's other backends."""
    import keras
    import numpy as np

    shape = [args.batch_size, *shape]
    rng = np.random.default_rng(0)
    images = (rng.integers(0, VOCABULARY, size=shape).astype("int32") if kind == "int"
              else rng.uniform(size=shape).astype("float32"))
    labels = rng.integers(0, classes, size=[args.batch_size])
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf  # lazy: only this backend's pipeline

        return tf.data.Dataset.from_tensors((images, labels)).repeat()

    def forever():
        while True:
            yield images, labels

    return forever()


def run_worker(args: argparse.Namespace) -> None:
    import keras
    import numpy as np

    import hvdkeras as hvd
    from hvdkeras import compat

    hvd.init()
    keras.utils.set_random_seed(0)  # the same initial weights in every run
    model, shape, kind, classes = build_model(args)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(1e-4), zero_stage=args.stage)
    # The applications end in a softmax; the own models give logits.
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=args.model in OWN_MODELS))
    data = synthetic_batches(args, shape, kind, classes)
    times: List[float] = []
    losses: List[float] = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)
            losses.append(float(logs["loss"]))

    model.fit(data, steps_per_epoch=args.warmup, epochs=1, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    model.fit(synthetic_batches(args, shape, kind, classes), steps_per_epoch=args.steps, epochs=1, verbose=0,
              callbacks=[Timer()])
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    state_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype.name if hasattr(v.dtype, "name")
                                                       else v.dtype).itemsize
                      for v in inner.variables)
    weight_bytes = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
    # What this rank's model variables store (their rows at stage 3).
    held_bytes = sum(int(np.prod(compat.variable_storage(v).shape)) * 4
                     for v in model.trainable_variables)
    rows = hvd.allgather_object({"state": state_bytes, "rss": peak_rss_bytes(),
                                 "held": held_bytes, "step_ms": 1000 * statistics.median(times)})
    if hvd.rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": rows, "weights": weight_bytes, "losses": losses}, f)


def launch(args: argparse.Namespace, ranks: int, stage: int, work: str) -> dict:
    out = os.path.join(work, f"np{ranks}-stage{stage}.json")
    steps = args.steps if ranks == args.timed_ranks else 2
    if args.lab:
        import lab_steps  # lazy: the lab's launcher, only with --lab
        launcher = lab_steps.lab_launcher(args.lab, ",".join(f"h{i}:1" for i in range(ranks)),
                                          ranks)
    else:
        launcher = ["hvdkerasrun", "-np", str(ranks)]
    subprocess.run([*launcher, sys.executable, HERE,
                    "--model", args.model, "--image-size", str(args.image_size),
                    "--batch-size", str(args.batch_size), "--warmup", str(args.warmup),
                    "--steps", str(steps), "--stage", str(stage), "--json", out], check=True)
    with open(out) as f:
        return json.load(f)


def main(argv: List[str]) -> None:
    args = parse_args(argv)
    if args.stage is not None:
        run_worker(args)
        return
    mib = 2.0 ** 20
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    size = f" {args.image_size}px" if args.model not in OWN_MODELS else ""
    where = f", one rank per host of lab {args.lab}" if args.lab else ""
    lines = [f"{args.model}{size}, Adam, batch {args.batch_size} per rank, "
             f"{os.cpu_count()} cores{where}, KERAS_BACKEND={backend}",
             "| ranks | stage | optimizer state, fullest rank MiB | of stage 0 | 1/N | "
             "weights held, fullest rank MiB | peak RSS, largest rank MiB | "
             "RSS vs stage 0 MiB | step ms (median) | step vs stage 0 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    stages = ([int(s) for s in args.stages.split(",")] if args.stages
              else [0, 1, 2, 3])
    losses = []
    with tempfile.TemporaryDirectory(prefix="zero-benchmark-") as work:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            rounds = args.rounds if ranks == args.timed_ranks else 1
            results = {stage: [] for stage in stages}
            for _ in range(rounds):  # interleaved, so drifts in machine speed hit every stage
                for stage in results:
                    results[stage].append(launch(args, ranks, stage, work))
            base = None
            for stage, runs in results.items():
                state = max(r["state"] for r in runs[0]["ranks"])
                held = max(r["held"] for r in runs[0]["ranks"])
                losses.append(f"{ranks} rank(s), stage {stage}: "
                              + " ".join(f"{x:.6g}" for x in runs[0]["losses"]))
                rss = max(r["rss"] for run in runs for r in run["ranks"])
                step = statistics.median(max(r["step_ms"] for r in run["ranks"]) for run in runs)
                base = base or (state, rss, step)
                timed = (f"{step:.0f} | {step / base[2]:.3f}" if ranks == args.timed_ranks
                         else "oversubscribed | -")
                lines.append(f"| {ranks} | {stage} | {state / mib:.1f} | "
                             f"{state / base[0]:.3f} | {1 / ranks:.3f} | {held / mib:.1f} | "
                             f"{rss / mib:.0f} | {(rss - base[1]) / mib:+.0f} | {timed} |")
    print("\n".join(lines))
    print("losses per timed step:\n" + "\n".join(losses))


if __name__ == "__main__":
    main(sys.argv[1:])

#!/usr/bin/env python3
"""hvdkeras under each Keras backend against the frameworks' own data parallelism.

    python examples/backends_benchmark.py --backends tensorflow,torch,jax --models cnn,ResNet50

For each backend and model it runs, one after another on this machine:

* keras x1: plain Keras (`train_on_batch`, SGD), one process alone;
* keras x2: the same, two independent processes at once (the baseline: what
  two ranks could do if communication were free);
* hvdkeras: two ranks with `DistributedOptimizer` (`hvdkerasrun -np 2`);
  under torch also with `HVDKERAS_TORCH_BACKWARD_OVERLAP=1` and `=0`
  (reducing during the backward pass, and after it);
* native x2 / native: the framework's own data parallelism on two processes
  (PyTorch DDP over gloo; JAX multi-process with its CPU collectives) and its
  loop as two independent processes. TensorFlow has no row here.

It prints median step times and two ratios: efficiency (independent / data
parallel, 1.0 = communication free) for hvdkeras and for the native one, and
what hvdkeras adds to a step above two independent Keras processes, in ms.
Every two-process run gives each process cores/2 threads (hvdkeras does so
for its ranks by itself), so no baseline measures oversubscription. Each
rank has one core of its own only on a machine with at least two.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

HERE = os.path.abspath(__file__)
HVDKERASRUN = os.path.join(os.path.dirname(sys.executable), "hvdkerasrun")


def parse_args(argv: List[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="tensorflow,torch,jax")
    p.add_argument("--models", default="cnn,ResNet50", help="cnn and/or keras.applications names")
    p.add_argument("--image-size", type=int, default=64, help="for keras.applications models")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --------------------------------------------------------------------------
# workers (one process each)
# --------------------------------------------------------------------------


def build_model(name: str, image_size: int):
    import keras

    keras.utils.set_random_seed(0)
    if name == "cnn":
        shape, classes = (28, 28, 1), 10
        model = keras.Sequential([
            keras.Input(shape), keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(), keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(), keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"), keras.layers.Dense(classes)])
    else:
        shape, classes = (image_size, image_size, 3), 100
        model = getattr(keras.applications, name)(weights=None, input_shape=shape,
                                                  classes=classes, classifier_activation=None)
    return model, shape, classes


def batch(shape, classes: int, size: int):
    import numpy as np

    rng = np.random.default_rng(1)
    return (rng.normal(size=(size, *shape)).astype("float32"),
            rng.integers(0, classes, size=(size,)).astype("int32"))


def timed(step, warmup: int, steps: int) -> List[float]:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def limit_threads() -> None:
    """Each of P processes on this host gets cores/P threads (BENCH_THREADS), as
    hvdkeras gives its ranks: otherwise two independent processes oversubscribe
    the cores and the baseline measures contention, not computation."""
    threads = int(os.environ.get("BENCH_THREADS", "0"))
    if not threads:
        return
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
    elif backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)


def keras_worker(args: argparse.Namespace, distributed: bool) -> Dict:
    limit_threads()
    import keras

    hvd = None
    if distributed:
        import hvdkeras as hvd

        hvd.init()
    model, shape, classes = build_model(args.model, args.image_size)
    optimizer = keras.optimizers.SGD(0.01)
    if hvd is not None:
        optimizer = hvd.DistributedOptimizer(optimizer)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = batch(shape, classes, args.batch_size)
    if hvd is not None:
        model.train_on_batch(x, y)  # builds the optimizer's state
        hvd.broadcast_model(model)

    def step():
        model.train_on_batch(x, y)
        if keras.backend.backend() == "jax":
            import jax

            jax.block_until_ready(model.trainable_variables[0].value)

    return {"times": timed(step, args.warmup, args.steps),
            "rank": hvd.rank() if hvd is not None else 0}


def ddp_worker(args: argparse.Namespace, distributed: bool) -> Dict:
    import torch
    import torch.distributed as dist

    limit_threads()
    if distributed:
        dist.init_process_group("gloo")
    model, shape, classes = build_model(args.model, args.image_size)
    x, y = batch(shape, classes, args.batch_size)
    x, y = torch.from_numpy(x), torch.from_numpy(y).long()
    model(x[:1])
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        optimizer.zero_grad()
        loss_fn(net(x), y).backward()
        optimizer.step()

    times = timed(step, args.warmup, args.steps)
    rank = dist.get_rank() if distributed else 0
    if distributed:
        dist.destroy_process_group()
    return {"times": times, "rank": rank}


def jax_worker(args: argparse.Namespace, distributed: bool) -> Dict:
    import jax

    if distributed:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(os.environ["BENCH_COORDINATOR"], num_processes=2,
                                   process_id=int(os.environ["BENCH_RANK"]))
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    model, shape, classes = build_model(args.model, args.image_size)
    x, y = batch(shape, classes, args.batch_size)
    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    sharded = NamedSharding(mesh, PartitionSpec("data"))
    if distributed:  # each process holds its rows of the global batch
        x = jax.make_array_from_process_local_data(sharded, x)
        y = jax.make_array_from_process_local_data(sharded, y)
        trainable = [jax.device_put(t, replicated) for t in trainable]
        fixed = [jax.device_put(t, replicated) for t in fixed]

    def loss(params, fixed_values, xb, yb):
        logits, _ = model.stateless_call(params, fixed_values, xb, training=True)
        log_probs = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(log_probs, yb[:, None], axis=1))

    @jax.jit
    def train_step(params, fixed_values, xb, yb):
        grads = jax.grad(loss)(params, fixed_values, xb, yb)
        return [p - 0.01 * g for p, g in zip(params, grads)]

    state = {"params": trainable}

    def step():
        state["params"] = train_step(state["params"], fixed, x, y)
        jax.block_until_ready(state["params"])

    times = timed(step, args.warmup, args.steps)
    return {"times": times, "rank": jax.process_index() if distributed else 0}


WORKERS = {"keras": keras_worker, "ddp": ddp_worker, "jaxdist": jax_worker}


def run_worker(args: argparse.Namespace) -> None:
    kind, distributed = args.worker.split(":")
    result = WORKERS[kind](args, distributed == "dp")
    if result["rank"] == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)


# --------------------------------------------------------------------------
# the driver
# --------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_command(args: argparse.Namespace, worker: str, model: str, out: str) -> List[str]:
    return [sys.executable, HERE, "--worker", worker, "--model", model, "--json", out,
            "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
            "--warmup", str(args.warmup), "--steps", str(args.steps)]


def measure(args: argparse.Namespace, backend: str, model: str, worker: str,
            processes: int, launcher: str, extra_env: Optional[Dict[str, str]] = None
            ) -> Optional[float]:
    """Median step seconds of rank 0 (or of the first independent process)."""
    env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2",
           **(extra_env or {})}
    threads = max(1, (os.cpu_count() or 1) // processes)
    if processes > 1:  # see limit_threads; JAX's XLA reads its pool size from XLA_FLAGS
        env["BENCH_THREADS"] = str(threads)
        if threads == 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                "intra_op_parallelism_threads=1").strip()
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, f"r{k}.json") for k in range(processes)]
        if launcher == "hvdkerasrun":
            procs = [subprocess.Popen([HVDKERASRUN, "-np", str(processes),
                                       *_worker_command(args, worker, model, outs[0])],
                                      env=env, stdout=subprocess.DEVNULL)]
        else:  # independent processes, or a framework's own rendezvous
            port = _free_port()
            procs = []
            for k in range(processes):
                rank_env = {**env, "RANK": str(k), "WORLD_SIZE": str(processes),
                            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                            "BENCH_RANK": str(k), "BENCH_COORDINATOR": f"127.0.0.1:{port}"}
                procs.append(subprocess.Popen(_worker_command(args, worker, model, outs[k]),
                                              env=rank_env, stdout=subprocess.DEVNULL))
        codes = [p.wait(timeout=1800) for p in procs]
        if any(codes):
            print(f"  {backend} {model} {worker}: failed (exit {codes})", file=sys.stderr)
            return None
        medians = [statistics.median(json.load(open(o))["times"]) for o in outs
                   if os.path.exists(o)]
        return statistics.mean(medians) if medians else None


def main(argv: List[str]) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return 0
    native = {"torch": "ddp", "jax": "jaxdist"}
    rows = []
    for model in args.models.split(","):
        for backend in args.backends.split(","):
            row = {"model": model, "backend": backend}
            row["keras_1"] = measure(args, backend, model, "keras:alone", 1, "direct")
            row["keras_2x"] = measure(args, backend, model, "keras:alone", 2, "direct")
            row["hvdkeras_2"] = measure(args, backend, model, "keras:dp", 2, "hvdkerasrun")
            if backend == "torch":  # reducing during the backward pass, and after it
                for mode, key in (("1", "hvdkeras_2_during"), ("0", "hvdkeras_2_after")):
                    row[key] = measure(args, backend, model, "keras:dp", 2, "hvdkerasrun",
                                       {"HVDKERAS_TORCH_BACKWARD_OVERLAP": mode})
            if backend in native:
                row["native_2x"] = measure(args, backend, model, f"{native[backend]}:alone", 2,
                                           "direct")
                row["native_2"] = measure(args, backend, model, f"{native[backend]}:dp", 2,
                                          "direct")
            rows.append(row)
            print(json.dumps(row), flush=True)
    print_table(rows, args)
    return 0


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return "-" if not a or not b else f"{a / b:.3f}"


def print_table(rows: List[Dict], args: argparse.Namespace) -> None:
    print(f"\nmedian ms per step, batch {args.batch_size} per process, SGD, {args.steps} timed "
          f"steps after {args.warmup}; efficiency = two independent processes / two ranks")
    print("| model | backend | keras x1 | keras x2 | hvdkeras 2 ranks | hvdkeras efficiency "
          "| hvdkeras adds ms | native x2 | native 2 ranks | native efficiency |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        adds = (None if not r["hvdkeras_2"] or not r["keras_2x"]
                else r["hvdkeras_2"] - r["keras_2x"])
        print(f"| {r['model']} | {r['backend']} | {_ms(r['keras_1'])} | {_ms(r['keras_2x'])} | "
              f"{_ms(r['hvdkeras_2'])} | {_ratio(r['keras_2x'], r['hvdkeras_2'])} | "
              f"{_ms(adds)} | {_ms(r.get('native_2x'))} | {_ms(r.get('native_2'))} | "
              f"{_ratio(r.get('native_2x'), r.get('native_2'))} |")
    modes = [r for r in rows if r.get("hvdkeras_2_during") or r.get("hvdkeras_2_after")]
    if modes:
        print("\ntorch, hvdkeras 2 ranks: reducing during the backward pass "
              "(HVDKERAS_TORCH_BACKWARD_OVERLAP=1) and after it (=0); the table above has the "
              "default (auto: after it on one host)")
        print("| model | during ms | after ms | during efficiency | after efficiency |")
        print("|---|---|---|---|---|")
        for r in modes:
            print(f"| {r['model']} | {_ms(r.get('hvdkeras_2_during'))} | "
                  f"{_ms(r.get('hvdkeras_2_after'))} | "
                  f"{_ratio(r['keras_2x'], r.get('hvdkeras_2_during'))} | "
                  f"{_ratio(r['keras_2x'], r.get('hvdkeras_2_after'))} |")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

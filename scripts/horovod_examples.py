#!/usr/bin/env python3
"""Runs Horovod's own TensorFlow 2 examples on hvdkeras after `hvdkeras migrate`.

    python scripts/horovod_examples.py /path/to/horovod [--np 2] [--only NAME]

Each example is copied from Horovod's repository (not part of this one),
rewritten by `hvdkeras migrate` (no hand edits), and run with `hvdkerasrun
-np N` (the Spark example with plain `python`, on `local[N]` Spark). Where an
example downloads MNIST, this machine may have no network: a stand-in is
made from hvdkeras's bundled 8x8 digits (each scaled to 24x24 and centred in
28x28, drawn at random to MNIST's 60,000 + 10,000 images). The Keras
examples' `keras.datasets.mnist.load_data` reads it (a `sitecustomize` on
the ranks' PYTHONPATH installs that one replacement; nothing else is
changed); the Spark example finds it as the `mnist.bz2` LIBSVM file it would
otherwise fetch with wget (12,000 images: the file is text). The synthetic
benchmarks and the Spark example get small sizes on their command lines,
since this machine is a 2-core CPU. The Spark example's TensorBoard callback
needs the `tensorboard` package, installed here when missing, as the
example's own requirement.

Exit status: the number of examples that failed.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

REPO = Path(__file__).resolve().parent.parent
# Example -> its command-line arguments ({work}: the working directory, {np}:
# the number of ranks). The Spark example starts its own Spark job.
EXAMPLES: Dict[str, List[str]] = {
    "tensorflow2/tensorflow2_keras_mnist.py": [],
    "tensorflow2/tensorflow2_mnist.py": [],
    "tensorflow2/tensorflow2_synthetic_benchmark.py": [
        "--batch-size", "4", "--num-warmup-batches", "2", "--num-batches-per-iter", "2",
        "--num-iters", "2"],
    "tensorflow2/tensorflow2_keras_synthetic_benchmark.py": [
        "--batch-size", "4", "--num-batches-per-iter", "2", "--num-iters", "2"],
    "spark/keras/keras_spark_mnist.py": [
        "--num-proc", "{np}", "--epochs", "2", "--work-dir", "{work}/store",
        "--data-dir", "{work}"],
}
SPARK_EXAMPLES = {"spark/keras/keras_spark_mnist.py"}

SITECUSTOMIZE = '''\
"""Makes keras.datasets.mnist.load_data read HVDKERAS_MNIST_STANDIN (see
scripts/horovod_examples.py); installed only on the examples' PYTHONPATH."""
import importlib.abc
import importlib.util
import os
import sys

_TARGET = "keras.src.datasets.mnist"


def _load_data(path="mnist.npz"):
    import numpy as np
    with np.load(os.environ["HVDKERAS_MNIST_STANDIN"]) as f:
        return (f["x_train"], f["y_train"]), (f["x_test"], f["y_test"])


class _Replace(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        original = spec.loader.exec_module

        def exec_module(module):
            original(module)
            module.load_data = _load_data

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("HVDKERAS_MNIST_STANDIN"):
    sys.meta_path.insert(0, _Replace())
'''


def mnist_standin(path: Path) -> None:
    """MNIST-shaped arrays (uint8 28x28, labels 0-9) from the bundled 8x8 digits."""
    with gzip.open(REPO / "hvdkeras" / "data" / "digits.csv.gz", "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.float32)
    pixels, labels = rows[:, :64].reshape(-1, 8, 8), rows[:, 64].astype(np.uint8)
    big = np.kron(pixels, np.ones((3, 3), np.float32)) * (255.0 / 16.0)  # 24x24
    images = np.zeros((len(big), 28, 28), np.uint8)
    images[:, 2:26, 2:26] = np.clip(big, 0, 255).astype(np.uint8)
    rng = np.random.default_rng(0)

    def take(n):
        order = rng.integers(0, len(images), n)
        return images[order], labels[order]

    (x_train, y_train), (x_test, y_test) = take(60000), take(10000)
    np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def libsvm_standin(npz: Path, path: Path, rows: int = 12000) -> None:
    """The stand-in's first `rows` images as MNIST's bzip2 LIBSVM file
    ("label index:value ...", 1-based indices, values 0-255)."""
    import bz2

    with np.load(npz) as f:
        images, labels = f["x_train"][:rows].reshape(rows, -1), f["y_train"][:rows]
    lines = []
    for image, label in zip(images, labels):
        nonzero = np.flatnonzero(image)
        lines.append(" ".join([str(int(label))] +
                              [f"{i + 1}:{int(image[i])}" for i in nonzero]))
    path.write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("horovod", type=Path, help="a checkout of Horovod's repository")
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--only", default=None, help="run the examples whose path contains this")
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="horovod-examples-"))
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    mnist_standin(work / "mnist-standin.npz")
    if not args.only or "spark" in args.only:
        libsvm_standin(work / "mnist-standin.npz", work / "mnist.bz2")
        if importlib.util.find_spec("tensorboard") is None:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "tensorboard"],
                           check=True)
    env = dict(os.environ, HVDKERAS_MNIST_STANDIN=str(work / "mnist-standin.npz"),
               PYSPARK_PYTHON=sys.executable,
               SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
               PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    failed = 0
    for example, extra in EXAMPLES.items():
        if args.only and args.only not in example:
            continue
        name = Path(example).name
        migrated = work / name
        report = subprocess.run([sys.executable, "-m", "hvdkeras.cli", "migrate",
                                 str(args.horovod / "examples" / example), "-o", str(migrated)],
                                capture_output=True, text=True)
        summary = (report.stdout + report.stderr).strip().splitlines()
        changes = summary[-1:] or ["no report"]
        if report.returncode != 0:
            print(f"{example}: migrate failed: {report.stderr.strip()}", flush=True)
            failed += 1
            continue
        started = time.time()
        extra = [a.format(work=work, np=args.np) for a in extra]
        launcher = [] if example in SPARK_EXAMPLES else ["hvdkerasrun", "-np", str(args.np)]
        with open(work / f"{name}.log", "w") as log:
            result = subprocess.run([*launcher, sys.executable, str(migrated), *extra],
                                    cwd=work, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, timeout=args.timeout)
        seconds = time.time() - started
        status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
        failed += result.returncode != 0
        print(f"{example}: migrate: {changes[0]}; run at {args.np} ranks: {status} in "
              f"{seconds:.0f} s; log {work / (name + '.log')}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

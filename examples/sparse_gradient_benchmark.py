"""Sparse embedding gradients against `sparse_as_dense`, measured in one job.

For a small and a large vocabulary, trains a token embedding (plus a
position table, as a transformer's) under `DistributedOptimizer` both ways
and prints, per rank and step, the bytes that travel (allgathered rows and
indices, or the allreduced table) and the step time, with their ratios
(dense / sparse), and how far each ends from one process on the global
batch (rank 0 trains that reference in the same job):

    hvdkerasrun -np 2 python examples/sparse_gradient_benchmark.py
    hvdkerasrun -np 2 python examples/sparse_gradient_benchmark.py --vocabularies 1000 200000

Run with 2 ranks on one host here, the times share 2 cores; the bytes are
what the link would carry.
"""

from __future__ import annotations

import argparse
import time

import keras
import numpy as np

import hvdkeras as hvd


class TokensAndPositions(keras.layers.Layer):
    def __init__(self, vocabulary, length, width, **kwargs):
        super().__init__(**kwargs)
        self.tokens = keras.layers.Embedding(vocabulary, width)
        self.positions = keras.layers.Embedding(length, width)

    def call(self, ids):
        positions = keras.ops.arange(0, keras.ops.shape(ids)[-1], 1)
        return self.tokens(ids) + self.positions(positions)


def build(vocabulary, args, optimizer):
    keras.utils.set_random_seed(1)
    ids = keras.Input((args.length,), dtype="int32")
    x = TokensAndPositions(vocabulary, args.length, args.width)(ids)
    x = keras.layers.GlobalAveragePooling1D()(x)
    model = keras.Model(ids, keras.layers.Dense(2)(x))
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    return model


def run(vocabulary, dense, args, x, y):
    n, r, b = hvd.size(), hvd.rank(), args.batch
    mine = np.concatenate([np.arange(s * n * b + r * b, s * n * b + (r + 1) * b)
                           for s in range(args.steps)])
    # An explicit name: rank 0's reference optimizers would shift Keras's
    # automatic ones ("adam_2") and the ranks' collectives would not match.
    model = build(vocabulary, args, hvd.DistributedOptimizer(
        keras.optimizers.Adam(1e-3), sparse_as_dense=dense,
        name=f"embedding_{vocabulary}_{'dense' if dense else 'sparse'}"))
    warm = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    model.fit(x[mine[:b]], y[mine[:b]], batch_size=b, verbose=0, callbacks=warm)  # trace
    before, start = hvd.engine_stats(), time.perf_counter()
    model.fit(x[mine[b:]], y[mine[b:]], batch_size=b, verbose=0, shuffle=False)
    seconds = (time.perf_counter() - start) / (args.steps - 1)
    moved = hvd.engine_stats() - before
    per_step = (moved.bytes_reduced + moved.bytes_gathered) / (args.steps - 1)
    return model, per_step, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--vocabularies", type=int, nargs="+", default=[2000, 200000])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="per rank")
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    hvd.init()
    n = hvd.size()
    rows = args.steps * n * args.batch
    for vocabulary in args.vocabularies:
        rng = np.random.default_rng(0)
        x = rng.integers(0, vocabulary, size=(rows, args.length)).astype("int32")
        y = rng.integers(0, 2, size=(rows,)).astype("int32")
        results = {dense: run(vocabulary, dense, args, x, y) for dense in (False, True)}
        if hvd.rank() == 0:
            reference = build(vocabulary, args, keras.optimizers.Adam(1e-3))
            reference.fit(x, y, batch_size=n * args.batch, verbose=0, shuffle=False)
            want = reference.get_weights()
            for dense in (False, True):
                model, per_step, seconds = results[dense]
                apart = max(float(np.max(np.abs(a - w))) for a, w in
                            zip(model.get_weights(), want))
                print(f"vocabulary {vocabulary:>7} {'sparse_as_dense' if dense else 'sparse':>15}:"
                      f" {per_step / 2**20:8.2f} MiB/step, {seconds * 1e3:7.1f} ms/step, "
                      f"max |w - one process| {apart:.2g}")
            sparse, dense = results[False], results[True]
            print(f"vocabulary {vocabulary:>7} ratio dense/sparse: bytes "
                  f"{dense[1] / sparse[1]:.2f}x, step {dense[2] / sparse[2]:.2f}x", flush=True)


if __name__ == "__main__":
    main()

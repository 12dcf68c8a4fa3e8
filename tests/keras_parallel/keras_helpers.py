"""Shared pieces of the per-rank Keras tests: data sharding, reference
comparison and cross-rank equality checks.

The data of a test is a pure function of a seed, so every rank can rebuild
the whole global data set and take its own rows; the single-process reference
trains on the global batches in the same process, without hvdkeras.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import keras
import numpy as np
import tensorflow as tf

import hvdkeras as hvd

RTOL = 1e-5


def shard(array: np.ndarray, steps: int, per_rank: int) -> np.ndarray:
    """This rank's rows of each of `steps` consecutive global batches.

    Global batch s is rows [s*n*B, (s+1)*n*B); rank r owns its rows
    [r*B, (r+1)*B) (n ranks, B = per_rank).
    """
    n, r = hvd.size(), hvd.rank()
    glob = n * per_rank
    return np.concatenate([array[s * glob + r * per_rank: s * glob + (r + 1) * per_rank]
                           for s in range(steps)])


def regression_data(seed: int, rows: int, features: int = 6, outputs: int = 2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype("float32")
    y = rng.normal(size=(rows, outputs)).astype("float32")
    return x, y


def mlp(seed: int, features: int = 6, outputs: int = 2) -> keras.Model:
    """A small MLP whose initial weights depend only on `seed`."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(8, activation="tanh"),
        keras.layers.Dense(outputs),
    ])


def max_relative_difference(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> float:
    """max over tensors of max|a - e| / max|e| (norm-relative per tensor)."""
    worst = 0.0
    for a, e in zip(actual, expected):
        scale = max(float(np.max(np.abs(e))), 1e-12)
        worst = max(worst, float(np.max(np.abs(np.asarray(a) - np.asarray(e)))) / scale)
    return worst


def assert_weights_close(actual: Sequence[np.ndarray], expected: Sequence[np.ndarray],
                         what: str, rtol: float = RTOL) -> None:
    assert len(actual) == len(expected), f"{what}: {len(actual)} vs {len(expected)} tensors"
    worst = max_relative_difference(actual, expected)
    assert worst <= rtol, (f"{what}: max relative difference {worst:.3g} > {rtol:g} "
                           f"on rank {hvd.rank()}")


def assert_weights_moved(before: Sequence[np.ndarray], after: Sequence[np.ndarray],
                         what: str) -> None:
    moved = max_relative_difference(after, before)
    assert moved > 1e-3, f"{what}: weights barely changed ({moved:.3g}); the test would prove nothing"


def spread_over_ranks(values: Sequence[np.ndarray], name: str) -> float:
    """max over elements of (max over ranks - min over ranks); 0 if identical."""
    flat = np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in values])
    both = np.concatenate([flat, -flat])
    reduced = hvd.allreduce(tf.constant(both), op=hvd.Max, name=name).numpy()
    high, low = reduced[: flat.size], -reduced[flat.size:]
    return float(np.max(high - low)) if flat.size else 0.0


def variable_values(variables) -> List[np.ndarray]:
    return [np.array(keras.ops.convert_to_numpy(v)) for v in variables]


def fit_distributed(model: keras.Model, x, y, batch_size: int, callbacks=None, **kwargs):
    """fit() on this rank's shard, with the broadcast callback first."""
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)] + list(callbacks or [])
    return model.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0,
                     callbacks=callbacks, **kwargs)


def run_reference(make_model: Callable[[], keras.Model], x, y, batch_size: int, **kwargs):
    model = make_model()
    model.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0, **kwargs)
    return model

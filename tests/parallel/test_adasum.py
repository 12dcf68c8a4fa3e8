"""Adasum (op=hvdkeras.Adasum) against a NumPy reference of Horovod's formula,
computed from what each rank contributed."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import MODES, WORLD_RANK, WORLD_SIZE, run


def contribution(rank: int, shape=(3, 2)) -> np.ndarray:
    rng = np.random.default_rng(100 + rank)
    return rng.normal(size=shape)


def reference(values):
    """Horovod's pairwise rule, neighbours first, in float64."""
    level = [np.asarray(v, np.float64) for v in values]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[0::2], level[1::2]):
            dot, na, nb = np.sum(a * b), np.sum(a * a), np.sum(b * b)
            nxt.append((1 - dot / (2 * na)) * a + (1 - dot / (2 * nb)) * b)
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def test_the_pair_rule_on_known_vectors():
    """Orthogonal vectors add; equal vectors stay (no doubling); opposite cancel to zero."""
    from hvdkeras.collectives.adasum import combine
    a = tf.constant([1.0, 0.0], tf.float64)
    np.testing.assert_allclose(combine(a, tf.constant([0.0, 2.0], tf.float64)), [1.0, 2.0])
    np.testing.assert_allclose(combine(a, a), [1.0, 0.0])
    np.testing.assert_allclose(combine(a, tf.zeros(2, tf.float64)), [1.0, 0.0])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=["float32", "float64"])
def test_adasum_allreduce_matches_the_formula(dtype, mode):
    x = tf.constant(contribution(WORLD_RANK), dtype)
    y = tf.constant(contribution(WORLD_RANK, (4,)) * 3, dtype)
    got = run(mode, lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Adasum, name="adasum"),
              x, y)
    single = run(mode, lambda a: hvd.allreduce(a, op=hvd.Adasum, name="adasum1"), x)
    rtol = 1e-12 if dtype == tf.float64 else 1e-6
    want_x = reference([contribution(r) for r in range(WORLD_SIZE)])
    want_y = reference([contribution(r, (4,)) * 3 for r in range(WORLD_SIZE)])

    def check(got_values, want):
        # Rounding in the working dtype scales with the largest values
        # combined, not with each result: an element that nearly cancels
        # (from 4 ranks on) is held to the vector's scale.
        np.testing.assert_allclose(got_values, want, rtol=rtol, atol=rtol * np.abs(want).max())

    check(got[0].numpy(), want_x)
    check(got[1].numpy(), want_y)
    check(single.numpy(), want_x)


def test_adasum_refuses_integers_and_slices():
    with pytest.raises(ValueError, match="floating-point"):
        hvd.allreduce(tf.ones([2], tf.int32), op=hvd.Adasum)
    slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([2, 2]))
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(slices, op=hvd.Adasum)

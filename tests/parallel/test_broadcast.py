"""broadcast and broadcast_variables from every root, for every dtype.

Runs under mpiexec (see tests/test_collectives_mpi.py). Each rank starts from
values that depend on its rank; afterwards every rank must hold exactly the
root's values.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import (
    BROADCAST_DTYPES, MODES, ROOTS, SHAPES, WORLD_RANK, WORLD_SIZE, as_dtype, assert_exact, ids,
    run, tensor,
)


def values_of(rank: int, shape, salt: int = 0) -> np.ndarray:
    """Rank-dependent small non-negative integers (0..12): exact in every dtype.

    Bool sees value != 0: element i is non-zero where bit (i mod 6) of
    rank + 1 is set, so up to 62 ranks differ from each other in a tensor
    of 6 or more elements, and every rank has both values there; a wrong
    root is visible in every dtype.
    """
    i = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    kept = ((rank + 1) >> (i % 6)) & 1
    return (1 + (i * (rank + 1) + rank + salt) % 12) * kept


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("root", ROOTS, ids=lambda r: f"root{r}")
@pytest.mark.parametrize("shape", SHAPES, ids=ids(SHAPES))
@pytest.mark.parametrize("dtype", BROADCAST_DTYPES, ids=ids(BROADCAST_DTYPES))
def test_broadcast_every_dtype_from_every_root(dtype, shape, root, mode):
    """Every rank receives the root's tensor: every dtype incl. bool, every root."""
    got = run(mode, lambda x: hvd.broadcast(x, root_rank=root),
              tensor(values_of(WORLD_RANK, shape), dtype))
    assert_exact(got, as_dtype(values_of(root, shape), dtype), f"root {root}")


def test_values_differ_across_ranks():
    """Sanity check of the inputs: a broadcast that did nothing would be caught."""
    for dtype in (tf.bool, tf.uint8):
        per_rank = [as_dtype(values_of(r, (3, 4)), dtype) for r in range(WORLD_SIZE)]
        for a in range(WORLD_SIZE):
            for b in range(a + 1, WORLD_SIZE):
                assert not np.array_equal(per_rank[a], per_rank[b]), (dtype, a, b)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("root", ROOTS, ids=lambda r: f"root{r}")
def test_broadcast_scalar_and_empty(root, mode):
    """Rank-0 and zero-sized tensors broadcast too."""
    scalar, empty = run(mode, lambda a, b: (hvd.broadcast(a, root, name="scalar"),
                                            hvd.broadcast(b, root, name="empty")),
                        tf.constant(float(WORLD_RANK)), tf.zeros([0, 3], tf.int32))
    assert_exact(scalar, np.float32(root))
    assert_exact(empty, np.zeros([0, 3], np.int32))


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: f"root{r}")
def test_broadcast_large_tensor(root):
    """A 1M-element float64 tensor (8 MB) arrives intact."""
    got = hvd.broadcast(tensor(values_of(WORLD_RANK, (1 << 20,)), tf.float64), root)
    assert_exact(got, values_of(root, (1 << 20,)).astype(np.float64))


@pytest.mark.parametrize("root", ROOTS, ids=lambda r: f"root{r}")
def test_many_broadcasts_in_one_function(root):
    """30 concurrent named broadcasts of mixed dtypes in one graph (fused)."""
    specs = [((k % 4 + 1, 3), BROADCAST_DTYPES[k % len(BROADCAST_DTYPES)]) for k in range(30)]
    xs = [tensor(values_of(WORLD_RANK, s, salt=k), d) for k, (s, d) in enumerate(specs)]

    @tf.function
    def step(*inputs):
        return [hvd.broadcast(x, root, name=f"bcast_{k}") for k, x in enumerate(inputs)]

    for k, (g, (s, d)) in enumerate(zip(step(*xs), specs)):
        assert_exact(g, as_dtype(values_of(root, s, salt=k), d), f"bcast_{k}")


# ---------------------------------------------------------------- broadcast_variables

VARIABLE_SPECS = [  # (kind, shape, dtype)
    ("tf", (3,), tf.float32), ("keras", (2, 2), "float32"), ("tf", (2, 3), tf.int64),
    ("keras", (4,), "int32"), ("tf", (), tf.float64), ("tf", (2, 2, 2), tf.bool),
    ("keras", (3, 1), "float16"), ("tf", (5,), tf.bfloat16), ("keras", (2,), "bfloat16"),
    ("tf", (3,), tf.uint8),
]


def make_variables(rank: int) -> list:
    """tf.Variables and keras.Variables of mixed dtypes holding rank-dependent values."""
    out = []
    for k, (kind, shape, dtype) in enumerate(VARIABLE_SPECS):
        dt = tf.as_dtype(dtype)
        init = as_dtype(values_of(rank, shape, salt=k), dt)
        if kind == "tf":
            out.append(tf.Variable(init, dtype=dt))
        else:
            out.append(keras.Variable(init, dtype=dtype, trainable=False))
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("root", ROOTS, ids=lambda r: f"root{r}")
def test_broadcast_variables_from_every_root(root, mode):
    """After broadcast_variables every variable holds the root's value, dtype unchanged."""
    variables = make_variables(WORLD_RANK)
    if mode == "eager":
        hvd.broadcast_variables(variables, root_rank=root)
    else:
        tf.function(lambda: hvd.broadcast_variables(variables, root_rank=root))()
    for k, (v, (kind, shape, dtype)) in enumerate(zip(variables, VARIABLE_SPECS)):
        dt = tf.as_dtype(dtype)
        assert_exact(tf.convert_to_tensor(v), as_dtype(values_of(root, shape, salt=k), dt),
                     f"{kind} variable {k} ({dt.name}{list(shape)})")


def test_broadcast_variables_of_nothing():
    """An empty list is a no-op (nothing is submitted, so ranks stay in step)."""
    assert hvd.broadcast_variables([]) is None


def test_broadcast_variables_of_a_keras_model():
    """A model built with rank-dependent seeds ends up identical on every rank."""
    keras.utils.set_random_seed(100 + WORLD_RANK)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    hvd.broadcast_variables(model.variables, root_rank=0)
    mine = [v.numpy() for v in model.variables]
    keras.utils.set_random_seed(100)
    reference = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
    for got, want in zip(mine, reference.variables):
        assert_exact(got, want.numpy())


def test_in_place_broadcast_returns_the_variables():
    """Horovod's broadcast_: the variables take the root's values and come back."""
    variables = [tf.Variable(values_of(WORLD_RANK, (2, 3)).astype("float32")),
                 tf.Variable(tf.constant([WORLD_RANK + 7], tf.int32))]
    returned = hvd.broadcast_(variables, root_rank=WORLD_SIZE - 1)
    assert returned is variables
    assert_exact(variables[0].numpy(), values_of(WORLD_SIZE - 1, (2, 3)).astype("float32"))
    assert_exact(variables[1].numpy(), np.array([WORLD_SIZE + 6], np.int32))


def test_in_place_broadcast_in_tf1_graph_code():
    """Horovod's graph-mode contract: broadcast_ returns tensors whose
    evaluation assigns the root's values; broadcast_global_variables an op."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        v = tf.compat.v1.Variable(tf.fill([3], float(WORLD_RANK + 1)))
        w = tf.compat.v1.Variable(tf.fill([2], WORLD_RANK))
        session.run(tf.compat.v1.global_variables_initializer())
        out, = hvd.broadcast_([v], root_rank=WORLD_SIZE - 1, name="graph_bcast_inplace")
        assert_exact(session.run(out), np.full(3, float(WORLD_SIZE), np.float32))
        assert_exact(session.run(v), np.full(3, float(WORLD_SIZE), np.float32))
        session.run(v.assign(tf.fill([3], float(WORLD_RANK + 1))))
        session.run(hvd.broadcast_global_variables(0))
        assert_exact(session.run(v), np.full(3, 1.0, np.float32))
        assert_exact(session.run(w), np.zeros(2, np.int32))
    with pytest.raises(RuntimeError, match="TensorFlow 1 graph code"):
        hvd.broadcast_global_variables(0)

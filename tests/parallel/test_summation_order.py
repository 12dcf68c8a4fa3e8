"""One summation order on a host: allreduce and reducescatter add the ranks'
floating-point contributions left to right in rank order, bitwise, at every
size (Note [one summation order on a host] in ops/core/collectives.h).

Inputs mix magnitudes (1e-4 .. 1e4, both signs), so that adding them in
another order changes the last bits of many elements: with three ranks,
(x0 + x1) + x2 and x0 + (x1 + x2) differ. Each rank rebuilds every rank's
input and computes the fold in numpy, whose float32/float64 additions are
IEEE's, as the engine's are.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import WORLD_RANK, WORLD_SIZE

# Elements: below MPI's small-message cut-off, above it, and several
# shared-memory pieces (4 MiB) long.
SIZES = (7, 1000, 50_003, 1_500_001)
DTYPES = (np.float32, np.float64)


@pytest.fixture(autouse=True)
def _on_one_host_through_shared_memory():
    if not hvd.engine_config().shm_allreduce or hvd.local_size() != hvd.size():
        pytest.skip("the order is fixed on one host, through shared memory")


def contribution(rank: int, n: int, dtype) -> np.ndarray:
    rng = np.random.default_rng(1000 + rank)
    scale = 10.0 ** rng.uniform(-4, 4, n)
    return (rng.standard_normal(n) * scale).astype(dtype)


def left_fold(n: int, dtype) -> np.ndarray:
    total = contribution(0, n, dtype)
    for r in range(1, WORLD_SIZE):
        total = total + contribution(r, n, dtype)
    return total


def order_matters(n: int, dtype) -> bool:
    """Whether some other grouping of this input gives other bits (so the
    test could fail): x0 + (x1 + ... ) against the fold."""
    if WORLD_SIZE < 3:
        return False
    rest = contribution(1, n, dtype)
    for r in range(2, WORLD_SIZE):
        rest = rest + contribution(r, n, dtype)
    return not np.array_equal(contribution(0, n, dtype) + rest, left_fold(n, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", SIZES)
def test_allreduce_sum_is_the_rank_order_fold(n, dtype):
    got = hvd.allreduce(tf.constant(contribution(WORLD_RANK, n, dtype)), op=hvd.Sum,
                        name=f"fold_{n}_{np.dtype(dtype).name}").numpy()
    assert np.array_equal(got, left_fold(n, dtype))
    if n >= 1000:
        assert order_matters(n, dtype) == (WORLD_SIZE >= 3)


@pytest.mark.parametrize("n", SIZES)
def test_grouped_allreduce_sums_as_a_lone_one(n):
    # Fused with a neighbour: the same bits as alone.
    ones = tf.ones([3], tf.float32)
    got, _ = hvd.grouped_allreduce([tf.constant(contribution(WORLD_RANK, n, np.float32)), ones],
                                   op=hvd.Sum, name=f"fold_grouped_{n}")
    assert np.array_equal(got.numpy(), left_fold(n, np.float32))


@pytest.mark.parametrize("op", (hvd.Sum, hvd.Average), ids=("sum", "average"))
@pytest.mark.parametrize("n", SIZES)
def test_reducescatter_keeps_the_allreduce_bits(n, op):
    rows = n  # a 1-D tensor: rank r keeps n // size rows (+1 below n % size)
    x = tf.constant(contribution(WORLD_RANK, rows, np.float32))
    whole = hvd.allreduce(x, op=op, name=f"fold_whole_{n}_{op}").numpy()
    mine = hvd.reducescatter(x, op=op, name=f"fold_scatter_{n}_{op}").numpy()
    start = sum(rows // WORLD_SIZE + (r < rows % WORLD_SIZE) for r in range(WORLD_RANK))
    assert np.array_equal(mine, whole[start:start + len(mine)])


def test_grouped_reducescatter_keeps_the_allreduce_bits():
    shapes = ((9, 5), (50_001,), (4, 3, 2))
    xs = [tf.constant(contribution(WORLD_RANK + 7 * i, int(np.prod(s)), np.float32)
                      .reshape(s)) for i, s in enumerate(shapes)]
    mine = hvd.grouped_reducescatter(xs, op=hvd.Sum, name="fold_grouped_scatter")
    for i, (x, got) in enumerate(zip(xs, mine)):
        whole = hvd.allreduce(x, op=hvd.Sum, name=f"fold_grouped_whole_{i}").numpy()
        rows = x.shape[0]
        start = sum(rows // WORLD_SIZE + (r < rows % WORLD_SIZE) for r in range(WORLD_RANK))
        assert np.array_equal(got.numpy(), whole[start:start + got.shape[0]]), i

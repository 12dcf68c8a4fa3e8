"""allgather, alltoall, reducescatter (and grouped forms), sparse allreduce,
barrier and their gradients: exact values on every rank.

Runs under mpiexec (see tests/test_collectives_mpi.py) with 1, 2 and 3 ranks.
Every input is a pure function of the rank, so each rank rebuilds what every
other rank contributed and computes the expected result in numpy; results
are compared exactly (dtype, shape and values). Values are small integers,
exact in every dtype (float16/bfloat16 and int8/uint8 included).
Their cross-rank mismatches are in the table of test_mismatches.py.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from hvdkeras.host import buffers
from parallel_helpers import (
    ALLREDUCE_DTYPES, BROADCAST_DTYPES, FLOAT_DTYPES, MODES, WORLD_RANK, WORLD_SIZE, as_dtype,
    assert_exact, ids, run, tensor,
)

RANKS = range(WORLD_SIZE)
IS_LAST = WORLD_RANK == WORLD_SIZE - 1
# Trailing dimensions of 1-, 2- and 3-dimensional inputs (the first is the rows).
TRAILING = {1: (), 2: (3,), 3: (2, 2)}
DIMS = tuple(TRAILING)
OP_NAMES = {hvd.Sum: "Sum", hvd.Average: "Average"}
SCATTER_OPS = (hvd.Sum, hvd.Average)
SCALES = [(0.5, 1.0), (1.0, 4.0), (0.5, 4.0)]


def pattern(rows: int, trailing: tuple, rank: int, modulus: int = 7) -> np.ndarray:
    """Rank-dependent small integers (int64) of shape (rows, *trailing)."""
    n = rows * int(np.prod(trailing, dtype=np.int64))
    return ((np.arange(n, dtype=np.int64) + 5 * rank) % modulus).reshape((rows, *trailing))


def block_of(rows: int, rank: int) -> tuple[int, int]:
    """(first row, row count) of `rank`'s block when `rows` are scattered over the world."""
    counts = [rows // WORLD_SIZE + (1 if r < rows % WORLD_SIZE else 0) for r in RANKS]
    return sum(counts[:rank]), counts[rank]


# ---------------------------------------------------------------- allgather

def gather_rows(rank: int) -> int:
    """Rows rank r contributes: 0, 2, 1 for ranks 0, 1, 2 (rank 0 sends none)."""
    return (2 * rank) % 3


ROW_PATTERNS = {
    "rank0_empty": gather_rows,
    "ascending": lambda r: r + 1,
    "last_empty": lambda r: 0 if r == WORLD_SIZE - 1 else r + 1,
    "all_empty": lambda r: 0,
}


def gather_expected(rows_of, trailing, dtype) -> np.ndarray:
    return np.concatenate(
        [as_dtype(pattern(rows_of(r), trailing, r), dtype) for r in RANKS], axis=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d}d")
@pytest.mark.parametrize("dtype", BROADCAST_DTYPES, ids=ids(BROADCAST_DTYPES))
def test_allgather_every_dtype_and_rank(dtype, dims, mode):
    """Rank-dependent first dimensions (rank 0 contributes 0 rows), every dtype, 1-3 dims."""
    trailing = TRAILING[dims]
    x = tensor(pattern(gather_rows(WORLD_RANK), trailing, WORLD_RANK), dtype)
    got = run(mode, lambda t: hvd.allgather(t), x)
    assert_exact(got, gather_expected(gather_rows, trailing, dtype), f"allgather {dtype.name}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", list(ROW_PATTERNS), ids=str)
def test_allgather_row_patterns(rows, mode):
    """Ascending rows, the last rank empty, every rank empty."""
    rows_of = ROW_PATTERNS[rows]
    x = tensor(pattern(rows_of(WORLD_RANK), (2, 3), WORLD_RANK), tf.int32)
    got = run(mode, lambda t: hvd.allgather(t, name="ag_rows"), x)
    assert_exact(got, gather_expected(rows_of, (2, 3), tf.int32))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", (tf.float32, tf.int8, tf.bool),
                         ids=ids((tf.float32, tf.int8, tf.bool)))
def test_grouped_allgather(dtype, mode):
    """Three tensors of one dtype, different trailing shapes and row counts, one op."""
    specs = [(lambda r: r + 1, (3,)), (gather_rows, (2, 2)), (lambda r: 1, ())]

    def mine(k):
        rows_of, trailing = specs[k]
        return tensor(pattern(rows_of(WORLD_RANK), trailing, WORLD_RANK + k), dtype)

    def expect(k):
        rows_of, trailing = specs[k]
        return np.concatenate(
            [as_dtype(pattern(rows_of(r), trailing, r + k), dtype) for r in RANKS], axis=0)

    got = run(mode, lambda a, b, c: hvd.grouped_allgather([a, b, c], name="gag"),
              mine(0), mine(1), mine(2))
    assert len(got) == 3
    for k in range(3):
        assert_exact(got[k], expect(k), f"grouped_allgather tensor {k}")


def test_grouped_allgather_of_nothing_and_mixed_dtypes():
    """An empty group is a no-op; mixed dtypes travel in one fused op per dtype."""
    assert hvd.grouped_allgather([]) == []
    a, b = hvd.grouped_allgather([tf.fill([1], float(WORLD_RANK)),
                                  tf.fill([2], WORLD_RANK)], name="gag_mixed")
    assert_exact(a, np.arange(WORLD_SIZE, dtype=np.float32))
    assert_exact(b, np.repeat(np.arange(WORLD_SIZE, dtype=np.int32), 2))


def test_engine_stats_count_every_rank_s_part_of_what_was_gathered():
    """`bytes_gathered` is what landed on this rank: rank r gives r + 1 rows
    of 3 float32 and, in a fused group, r + 2 rows of 2 float64."""
    before = hvd.engine_stats()
    hvd.allgather(tf.ones([WORLD_RANK + 1, 3], tf.float32), name="stats_gather_one")
    hvd.grouped_allgather([tf.ones([WORLD_RANK + 1, 3], tf.float32),
                           tf.ones([WORLD_RANK + 2, 2], tf.float64)], name="stats_gather_two")
    spent = hvd.engine_stats() - before
    first = sum(r + 1 for r in range(WORLD_SIZE)) * 3 * 4
    second = first + sum(r + 2 for r in range(WORLD_SIZE)) * 2 * 8
    assert spent.bytes_gathered == first + second, (spent, first, second)
    assert spent.bytes_reduced == 0, spent


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_without_splits_needs_equal_blocks(mode):
    """Horovod's rule: without splits the rows must divide evenly, else every
    rank gets InvalidArgumentError (nothing is sent)."""
    if WORLD_SIZE == 1:
        pytest.skip("every number of rows is a multiple of one rank")
    x = tf.zeros([WORLD_SIZE + 1, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="multiple of the"):
        run(mode, lambda t: hvd.alltoall(t, name="a2a_uneven_default"), x)
    out = hvd.alltoall(tf.fill([WORLD_SIZE], WORLD_RANK), name="a2a_after_error")
    assert_exact(out, np.arange(WORLD_SIZE, dtype=np.int32))


def test_allgather_rejects_scalars():
    """A scalar has no first dimension to concatenate along: ValueError, nothing sent."""
    with pytest.raises(ValueError, match="at least one dimension"):
        hvd.allgather(tf.constant(1.0))


# ---------------------------------------------------------------- alltoall

SPLIT_PATTERNS = {
    # splits[d] that sender s sends to receiver d
    "uneven": lambda s, d: s + 2 * d + 1,
    "with_zeros": lambda s, d: (s + 2 * d) % 3,  # every rank sends nothing to someone
    "rank0_sends_nothing": lambda s, d: 0 if s == 0 else d + 1,
    "default": None,  # hvd.alltoall's equal blocks of (s + 1) * size rows
}


def splits_of(name: str, sender: int) -> list[int]:
    fn = SPLIT_PATTERNS[name]
    if fn is None:
        return [sender + 1] * WORLD_SIZE
    return [fn(sender, d) for d in RANKS]


def a2a_input(name: str, sender: int, trailing, dtype) -> np.ndarray:
    rows = sum(splits_of(name, sender))
    return as_dtype(pattern(rows, trailing, sender, modulus=101), dtype)


def a2a_expected(name: str, trailing, dtype, receiver: int = WORLD_RANK):
    """(rows `receiver` gets, ordered by sender; how many from each sender)."""
    parts, counts = [], []
    for s in RANKS:
        splits = splits_of(name, s)
        start = sum(splits[:receiver])
        parts.append(a2a_input(name, s, trailing, dtype)[start:start + splits[receiver]])
        counts.append(splits[receiver])
    return np.concatenate(parts, axis=0), np.array(counts, np.int64)


def run_alltoall(mode: str, name: str, x: tf.Tensor, op_name: str = "a2a"):
    if SPLIT_PATTERNS[name] is None:  # Horovod's convention: the tensor alone comes back
        out = run(mode, lambda t: hvd.alltoall(t, name=op_name), x)
        return out, np.array([splits_of(name, s)[WORLD_RANK] for s in RANKS], np.int64)
    splits = tf.constant(splits_of(name, WORLD_RANK), tf.int64)
    return run(mode, lambda t, s: hvd.alltoall(t, splits=s, name=op_name), x, splits)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d}d")
@pytest.mark.parametrize("dtype", BROADCAST_DTYPES, ids=ids(BROADCAST_DTYPES))
def test_alltoall_every_dtype_and_rank(dtype, dims, mode):
    """Explicit uneven splits, every dtype, 1-3 dims; received_splits checked."""
    trailing = TRAILING[dims]
    x = tf.constant(a2a_input("uneven", WORLD_RANK, trailing, dtype), dtype=dtype)
    out, received = run_alltoall(mode, "uneven", x)
    want, counts = a2a_expected("uneven", trailing, dtype)
    assert_exact(out, want, f"alltoall {dtype.name}")
    assert_exact(received, counts, "received_splits")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", list(SPLIT_PATTERNS), ids=str)
def test_alltoall_split_patterns(splits, mode):
    """Zero splits (a rank sending nothing to someone, or to anyone) and default splits."""
    x = tf.constant(a2a_input(splits, WORLD_RANK, (2,), tf.float32))
    out, received = run_alltoall(mode, splits, x)
    want, counts = a2a_expected(splits, (2,), tf.float32)
    assert_exact(out, want)
    assert_exact(received, counts, "received_splits")


def test_alltoall_splits_as_python_list_and_numpy():
    """splits may be a list or a numpy array of any integer type."""
    x = tf.constant(a2a_input("uneven", WORLD_RANK, (), tf.int32), dtype=tf.int32)
    want, counts = a2a_expected("uneven", (), tf.int32)
    for splits in (splits_of("uneven", WORLD_RANK),
                   np.array(splits_of("uneven", WORLD_RANK), np.int32)):
        out, received = hvd.alltoall(x, splits=splits, name="a2a_list")
        assert_exact(out, want)
        assert_exact(received, counts)


# ---------------------------------------------------------------- reducescatter

SCATTER_ROWS = 5  # not a multiple of 2 or 3: lower ranks get one row more


def scatter_input(shape, rank: int) -> np.ndarray:
    """i % 4 + 2 * rank: the sum over ranks is a multiple of the world size."""
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.int64) % 4 + 2 * rank).reshape(shape)


def reduce_expected(op: int, shape, dtype: tf.DType, prescale=1.0, postscale=1.0,
                    rank: int = WORLD_RANK, inputs=scatter_input) -> np.ndarray:
    """`rank`'s block of post * op_s(pre * x_s), as numpy values in `dtype`."""
    total = np.sum([inputs(shape, r) for r in RANKS], axis=0).astype(np.float64) * prescale
    if op == hvd.Average:
        total = total / WORLD_SIZE
    total = total * postscale
    assert np.array_equal(total, np.round(total * 4) / 4), "test values must stay exact"
    start, count = block_of(shape[0], rank)
    return as_dtype(total[start:start + count], dtype)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", SCATTER_OPS, ids=OP_NAMES.get)
@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d}d")
@pytest.mark.parametrize("dtype", ALLREDUCE_DTYPES, ids=ids(ALLREDUCE_DTYPES))
def test_reducescatter_every_dtype_and_rank(dtype, dims, op, mode):
    """5 rows over 1-3 ranks (not divisible): rank r keeps 5//size (+1 if r < 5 % size)."""
    shape = (SCATTER_ROWS, *TRAILING[dims])
    x = tensor(scatter_input(shape, WORLD_RANK), dtype)
    got = run(mode, lambda t: hvd.reducescatter(t, op=op), x)
    assert_exact(got, reduce_expected(op, shape, dtype), f"reducescatter {dtype.name}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prescale,postscale", SCALES)
@pytest.mark.parametrize("op", SCATTER_OPS, ids=OP_NAMES.get)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids(FLOAT_DTYPES))
def test_reducescatter_prescale_and_postscale(dtype, op, prescale, postscale, mode):
    shape = (SCATTER_ROWS, 3)
    x = tensor(scatter_input(shape, WORLD_RANK), dtype)
    got = run(mode, lambda t: hvd.reducescatter(t, op=op, prescale_factor=prescale,
                                                postscale_factor=postscale), x)
    assert_exact(got, reduce_expected(op, shape, dtype, prescale, postscale))


@pytest.mark.parametrize("rows", (1, 2, 3, 4))
def test_reducescatter_few_rows(rows):
    """Fewer rows than ranks: the higher ranks get empty blocks."""
    shape = (rows, 2)
    got = hvd.reducescatter(tensor(scatter_input(shape, WORLD_RANK), tf.float32), op=hvd.Sum)
    assert_exact(got, reduce_expected(hvd.Sum, shape, tf.float32))
    # The bindings that allocate GPU outputs themselves size them with
    # buffers.scatter_rows: it must agree with the engine's split.
    assert got.shape[0] == buffers.scatter_rows(rows, WORLD_SIZE, WORLD_RANK)


def test_reducescatter_default_op_is_average():
    shape = (SCATTER_ROWS,)
    got = hvd.reducescatter(tensor(scatter_input(shape, WORLD_RANK), tf.float64))
    assert_exact(got, reduce_expected(hvd.Average, shape, tf.float64))


@pytest.mark.parametrize("bad_op", (hvd.Min, hvd.Max, hvd.Product))
def test_reducescatter_rejects_other_ops(bad_op):
    with pytest.raises(ValueError, match="Sum or hvdkeras.Average"):
        hvd.reducescatter(tf.ones([4]), op=bad_op)
    with pytest.raises(ValueError, match="Sum or hvdkeras.Average"):
        hvd.grouped_reducescatter([tf.ones([4])], op=bad_op)


GROUP_SPECS = [((5, 3), tf.float32), ((4,), tf.float32), ((7, 2), tf.int32),
               ((3,), tf.float64), ((2, 2, 2), tf.int32)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", SCATTER_OPS, ids=OP_NAMES.get)
def test_grouped_reducescatter(op, mode):
    """Mixed shapes and dtypes (one fused op per dtype), each tensor scattered on its own."""
    xs = [tensor(scatter_input(shape, WORLD_RANK), dtype) for shape, dtype in GROUP_SPECS]
    got = run(mode, lambda *t: hvd.grouped_reducescatter(list(t), op=op, name="grs"), *xs)
    assert len(got) == len(GROUP_SPECS)
    for k, (shape, dtype) in enumerate(GROUP_SPECS):
        assert_exact(got[k], reduce_expected(op, shape, dtype), f"tensor {k} {shape}")


@pytest.mark.parametrize("mode", MODES)
def test_grouped_reducescatter_scaled(mode):
    specs = [((5, 3), tf.float32), ((3,), tf.float32), ((4, 2), tf.float16)]
    xs = [tensor(scatter_input(shape, WORLD_RANK), dtype) for shape, dtype in specs]
    got = run(mode, lambda *t: hvd.grouped_reducescatter(
        list(t), op=hvd.Average, prescale_factor=0.5, postscale_factor=4.0), *xs)
    for k, (shape, dtype) in enumerate(specs):
        assert_exact(got[k], reduce_expected(hvd.Average, shape, dtype, 0.5, 4.0))


# ---------------------------------------------------------------- sparse allreduce

DENSE_ROWS = 6


def sparse_input(rank: int, dtype: tf.DType = tf.float32):
    """(values [k, 3], indices [k] int32) with k = 0, 2, 1 for ranks 0, 1, 2."""
    k = gather_rows(rank) if WORLD_SIZE > 1 else 2
    values = as_dtype(pattern(k, (3,), rank) + 1, dtype)
    indices = np.array([(rank + 2 * j) % DENSE_ROWS for j in range(k)], np.int32)
    return values, indices


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", SCATTER_OPS, ids=OP_NAMES.get)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids(FLOAT_DTYPES))
def test_indexed_slices_allreduce(dtype, op, mode):
    """IndexedSlices in, IndexedSlices out: every rank's rows and indices, in rank order.

    Average multiplies the gathered values by 1 / size, rounded once to the
    values' dtype (float64 keeps full precision).
    """
    values, indices = sparse_input(WORLD_RANK, dtype)
    slices = tf.IndexedSlices(tf.constant(values, dtype=dtype), tf.constant(indices),
                              dense_shape=tf.constant([DENSE_ROWS, 3], tf.int64))
    got = run(mode, lambda s: hvd.allreduce(s, op=op, name="sparse"), slices)
    assert isinstance(got, tf.IndexedSlices), type(got)
    all_values = np.concatenate([sparse_input(r, dtype)[0] for r in RANKS])
    all_indices = np.concatenate([sparse_input(r)[1] for r in RANKS])
    if op == hvd.Average:
        all_values = all_values * as_dtype(np.float64(1.0 / WORLD_SIZE), dtype)
    assert_exact(got.values, all_values, "values")
    assert_exact(got.indices, all_indices, "indices")
    assert_exact(got.dense_shape, np.array([DENSE_ROWS, 3], np.int64), "dense_shape")
    if op == hvd.Sum and dtype == tf.float32:  # duplicates add up when densified
        dense = np.zeros((DENSE_ROWS, 3), np.float32)
        np.add.at(dense, all_indices, all_values)
        assert_exact(tf.convert_to_tensor(got), dense, "densified")


def test_indexed_slices_allreduce_scaled():
    values, indices = sparse_input(WORLD_RANK)
    slices = tf.IndexedSlices(tf.constant(values), tf.constant(indices),
                              dense_shape=tf.constant([DENSE_ROWS, 3], tf.int64))
    got = hvd.allreduce(slices, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
    all_values = np.concatenate([sparse_input(r)[0] for r in RANKS]) * np.float32(2.0)
    assert_exact(got.values, all_values)


@pytest.mark.parametrize("bad_op", (hvd.Min, hvd.Max, hvd.Product))
def test_indexed_slices_other_ops_are_errors(bad_op):
    """Horovod's contract: NotImplementedError, before anything is sent."""
    slices = tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]), dense_shape=tf.constant([4, 3]))
    with pytest.raises(NotImplementedError, match="densify"):
        hvd.allreduce(slices, op=bad_op)
    with pytest.raises(NotImplementedError, match="densify"):
        hvd.grouped_allreduce([tf.ones([2]), slices], op=bad_op)


@pytest.mark.parametrize("mode", MODES)
def test_indexed_slices_in_a_group_and_integer_average(mode):
    """grouped_allreduce takes slices beside dense tensors; an Average of
    integer rows is float64 (true division), as in Horovod."""
    rows = tf.IndexedSlices(tf.fill([1, 2], WORLD_RANK + 1), tf.constant([WORLD_RANK]),
                            dense_shape=tf.constant([WORLD_SIZE, 2]))

    def body(dense, values, indices):
        out = hvd.grouped_allreduce([dense, tf.IndexedSlices(values, indices,
                                                              tf.constant([WORLD_SIZE, 2]))],
                                    op=hvd.Average, name="group_sparse")
        return out[0], out[1].values, out[1].indices

    dense, values, indices = run(mode, body, tf.fill([3], float(WORLD_RANK)), rows.values,
                                 rows.indices)
    assert_exact(dense, np.full(3, (WORLD_SIZE - 1) / 2, np.float32), "dense")
    assert values.dtype == tf.float64
    assert_exact(values, np.repeat(np.arange(1, WORLD_SIZE + 1)[:, None], 2, axis=1)
                 / WORLD_SIZE, "values")
    assert_exact(indices, np.arange(WORLD_SIZE, dtype=np.int32), "indices")


# ---------------------------------------------------------------- barrier

@pytest.mark.parametrize("mode", MODES)
def test_barrier_waits_for_every_rank(mode):
    """Every rank leaves the barrier after the last rank entered it.

    Rank r enters after sleeping 0.3 * r s; all ranks run on this machine, so
    their wall clocks are comparable.
    """
    barrier = (lambda: hvd.barrier(name="bar")) if mode == "eager" else tf.function(
        lambda: hvd.barrier(name="bar"))
    barrier()  # line the ranks up (and trace the function) first
    time.sleep(0.3 * WORLD_RANK)
    entered = time.time()
    barrier()
    left = time.time()
    times = hvd.allgather(tf.constant([[entered, left]], tf.float64), name="bar_times").numpy()
    assert times.shape == (WORLD_SIZE, 2)
    assert times[:, 1].min() >= times[:, 0].max(), times


def test_barrier_default_name():
    hvd.barrier()
    hvd.barrier()


# ---------------------------------------------------------------- gradients
#
# Each rank r differentiates its own loss L_r = sum(c_r * y_r) (y_r: its
# output, c_r: rank-dependent weights). The gradient a rank gets for its input
# is the derivative of the global loss sum_r L_r (Horovod's convention).

def weights(shape, rank: int) -> np.ndarray:
    n = int(np.prod(shape))
    return (np.arange(n, dtype=np.float64) % 5 + rank + 1).reshape(shape)


def run_with_tape(mode: str, body, *args):
    def wrapped(*a):
        with tf.GradientTape() as tape:
            return body(tape, *a)
    if mode == "function":
        wrapped = tf.function(wrapped)
    return wrapped(*args)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient(mode):
    """y = concat_s x_s: dL/dx_r = sum_q c_q[rows of r]."""
    def rows_of(r):
        return r + 1
    trailing = (2,)
    offsets = np.cumsum([0] + [rows_of(r) for r in RANKS])
    total = int(offsets[-1])
    x = tf.constant(pattern(rows_of(WORLD_RANK), trailing, WORLD_RANK).astype(np.float64))
    c = tf.constant(weights((total, *trailing), WORLD_RANK))

    def body(tape, x, c):
        tape.watch(x)
        y = hvd.allgather(x, name="grad_ag")
        return y, tape.gradient(tf.reduce_sum(c * y), x)

    y, dx = run_with_tape(mode, body, x, c)
    assert_exact(y, np.concatenate([pattern(rows_of(r), trailing, r) for r in RANKS])
                 .astype(np.float64), "forward")
    summed = np.sum([weights((total, *trailing), q) for q in RANKS], axis=0)
    start = offsets[WORLD_RANK]
    assert_exact(dx, summed[start:start + rows_of(WORLD_RANK)], "gradient")


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allgather_gradient(mode):
    """Each tensor of a group gets its own rows of the summed output gradients."""
    specs = [(lambda r: r + 1, (3,)), (gather_rows, ())]
    totals = [sum(rows_of(r) for r in RANKS) for rows_of, _ in specs]
    xs = [tf.constant(pattern(rows_of(WORLD_RANK), tr, WORLD_RANK).astype(np.float32))
          for rows_of, tr in specs]
    cs = [tf.constant(weights((totals[k], *specs[k][1]), WORLD_RANK + k).astype(np.float32))
          for k in range(2)]

    def body(tape, x0, x1, c0, c1):
        tape.watch([x0, x1])
        y0, y1 = hvd.grouped_allgather([x0, x1], name="grad_gag")
        loss = tf.reduce_sum(c0 * y0) + tf.reduce_sum(c1 * y1)
        return tape.gradient(loss, [x0, x1])

    dxs = run_with_tape(mode, body, *xs, *cs)
    for k, (rows_of, tr) in enumerate(specs):
        summed = np.sum([weights((totals[k], *tr), q + k) for q in RANKS], axis=0)
        start = sum(rows_of(r) for r in range(WORLD_RANK))
        assert_exact(dxs[k], summed[start:start + rows_of(WORLD_RANK)].astype(np.float32),
                     f"gradient {k}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", ("uneven", "with_zeros", "default"), ids=str)
def test_alltoall_gradient(splits, mode):
    """Row j of x_s went to position p of y_d: dL/dx_s[j] = c_d[p]."""
    trailing = (2,)
    x = tf.constant(a2a_input(splits, WORLD_RANK, trailing, tf.float64))
    recv_rows = {d: sum(splits_of(splits, s)[d] for s in RANKS) for d in RANKS}
    c = tf.constant(weights((recv_rows[WORLD_RANK], *trailing), WORLD_RANK))

    def body(tape, x, c):
        tape.watch(x)
        if SPLIT_PATTERNS[splits] is None:
            y = hvd.alltoall(x, name="grad_a2a")
        else:
            y, _ = hvd.alltoall(x, splits=splits_of(splits, WORLD_RANK), name="grad_a2a")
        return y, tape.gradient(tf.reduce_sum(c * y), x)

    y, dx = run_with_tape(mode, body, x, c)
    assert_exact(y, a2a_expected(splits, trailing, tf.float64)[0], "forward")
    mine = splits_of(splits, WORLD_RANK)
    parts = []
    for d in RANKS:  # the rows this rank sent to d, in order
        position = sum(splits_of(splits, s)[d] for s in range(WORLD_RANK))
        parts.append(weights((recv_rows[d], *trailing), d)[position:position + mine[d]])
    assert_exact(dx, np.concatenate(parts, axis=0), "gradient")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prescale,postscale", [(1.0, 1.0), (0.5, 4.0)])
@pytest.mark.parametrize("op", SCATTER_OPS, ids=OP_NAMES.get)
def test_reducescatter_gradient(op, prescale, postscale, mode):
    """y_r = post * op_s(pre * x_s)[block r]: dL/dx_q[i] = pre * post (/ size) * c_owner(i)."""
    shape = (SCATTER_ROWS, 2)
    x = tf.constant(scatter_input(shape, WORLD_RANK).astype(np.float64))
    c = tf.constant(weights((block_of(SCATTER_ROWS, WORLD_RANK)[1], 2), WORLD_RANK))

    def body(tape, x, c):
        tape.watch(x)
        y = hvd.reducescatter(x, op=op, prescale_factor=prescale, postscale_factor=postscale,
                              name="grad_rs")
        return y, tape.gradient(tf.reduce_sum(c * y), x)

    y, dx = run_with_tape(mode, body, x, c)
    assert_exact(y, reduce_expected(op, shape, tf.float64, prescale, postscale), "forward")
    scale = prescale * postscale / (WORLD_SIZE if op == hvd.Average else 1)
    want = np.concatenate([weights((block_of(SCATTER_ROWS, r)[1], 2), r) for r in RANKS])
    assert_exact(dx, want * scale, "gradient")


@pytest.mark.parametrize("mode", MODES)
def test_grouped_reducescatter_gradient(mode):
    shapes = [(SCATTER_ROWS, 2), (4,)]
    xs = [tf.constant(scatter_input(s, WORLD_RANK).astype(np.float32)) for s in shapes]
    cs = [tf.constant(weights((block_of(s[0], WORLD_RANK)[1], *s[1:]), WORLD_RANK + k)
                      .astype(np.float32)) for k, s in enumerate(shapes)]

    def body(tape, x0, x1, c0, c1):
        tape.watch([x0, x1])
        y0, y1 = hvd.grouped_reducescatter([x0, x1], op=hvd.Sum, name="grad_grs")
        return tape.gradient(tf.reduce_sum(c0 * y0) + tf.reduce_sum(c1 * y1), [x0, x1])

    dxs = run_with_tape(mode, body, *xs, *cs)
    for k, s in enumerate(shapes):
        want = np.concatenate([weights((block_of(s[0], r)[1], *s[1:]), r + k) for r in RANKS])
        assert_exact(dxs[k], want.astype(np.float32), f"gradient {k}")

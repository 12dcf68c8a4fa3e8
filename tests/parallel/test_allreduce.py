"""allreduce and grouped_allreduce on every rank: exact results for every dtype.

Runs under mpiexec (see tests/test_collectives_mpi.py). Values are small
integers (or halves of them) so every result is exactly representable in
every dtype, float16/bfloat16 and int8/uint8 included (up to 8 ranks; above,
integer sums wrap as the engine's do, and the expectations say so), and
results are compared with np.array_equal.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import (
    ALLREDUCE_DTYPES, FLOAT_DTYPES, MODES, SHAPES, WORLD_RANK, WORLD_SIZE, as_dtype,
    assert_exact, ids, np_dtype, run, tensor,
)

OPS = (hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product)
OP_NAMES = {hvd.Sum: "Sum", hvd.Average: "Average", hvd.Min: "Min", hvd.Max: "Max",
            hvd.Product: "Product"}
SIGNED_INT_DTYPES = (tf.int8, tf.int32, tf.int64)


# ---------------------------------------------------------------- inputs and expectations

def contribution(op: int, shape, rank: int) -> np.ndarray:
    """What `rank` contributes (int64) to a reduction `op` of a tensor of `shape`.

    Sum/Average: (i % 4) + 2*rank, so the sum over ranks is a multiple of the
    world size and the average is an exact integer. Min/Max: a different
    permutation-like pattern per rank. Product: 1s and 2s, so the product of
    3 ranks is at most 8. Every value fits int8 and uint8 and is exact in
    float16/bfloat16 (integer sums of 16 or more ranks wrap, as the engine's do).
    """
    i = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    if op in (hvd.Sum, hvd.Average):
        return i % 4 + 2 * rank
    if op in (hvd.Min, hvd.Max):
        return (i * (2 * rank + 1) + rank) % 7
    if op == hvd.Product:
        return 1 + (i + rank) % 2
    raise ValueError(op)


def int_div_toward_zero(a: np.ndarray, b: int) -> np.ndarray:
    """C++ integer division: the quotient rounded toward zero."""
    return np.sign(a) * (np.abs(a) // b)


def reduce_exact(op: int, parts: list[np.ndarray], dtype: tf.DType,
                 prescale: float = 1.0, postscale: float = 1.0) -> np.ndarray:
    """The reduction of `parts` (one per rank) as the engine defines it, in `dtype`.

    Average = sum / size, then * postscale; prescale multiplies each input.
    For integers with no scaling, Average is integer division toward zero.
    """
    stacked = np.stack(parts)
    size = len(parts)
    if dtype.is_integer and prescale == 1.0 and postscale == 1.0:
        stacked = stacked.astype(np.int64)
        if op == hvd.Sum:
            out = stacked.sum(0)
        elif op == hvd.Average:
            # The sum is taken in `dtype` (wrapping as C integers do, which
            # int8/uint8 sums of 16 or more ranks do here), then divided.
            wrapped = as_dtype(stacked.sum(0), dtype).astype(np.int64)
            out = int_div_toward_zero(wrapped, size)
        elif op == hvd.Min:
            out = stacked.min(0)
        elif op == hvd.Max:
            out = stacked.max(0)
        else:
            out = stacked.prod(0)
        return as_dtype(out, dtype)
    scaled = stacked.astype(np.float64) * prescale
    if op == hvd.Sum:
        out = scaled.sum(0) * postscale
    elif op == hvd.Average:
        out = scaled.sum(0) / size * postscale
    elif op == hvd.Min:
        out = scaled.min(0) * postscale
    elif op == hvd.Max:
        out = scaled.max(0) * postscale
    else:
        out = scaled.prod(0) * postscale
    return as_dtype(out, dtype)


def expected(op: int, shape, dtype: tf.DType, **scales) -> np.ndarray:
    return reduce_exact(op, [contribution(op, shape, r) for r in range(WORLD_SIZE)], dtype,
                        **scales)


def mine(op: int, shape, dtype: tf.DType) -> tf.Tensor:
    """This rank's input for `op`."""
    return tensor(contribution(op, shape, WORLD_RANK), dtype)


# ---------------------------------------------------------------- allreduce

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS, ids=OP_NAMES.get)
@pytest.mark.parametrize("shape", SHAPES, ids=ids(SHAPES))
@pytest.mark.parametrize("dtype", ALLREDUCE_DTYPES, ids=ids(ALLREDUCE_DTYPES))
def test_allreduce_every_dtype_shape_and_op(dtype, shape, op, mode):
    """Every dtype x rank 1-3 shape x reduction op, eagerly and in a tf.function."""
    got = run(mode, lambda x: hvd.allreduce(x, op=op), mine(op, shape, dtype))
    assert_exact(got, expected(op, shape, dtype), f"{OP_NAMES[op]} {dtype.name}{list(shape)}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prescale,postscale", [(0.5, 1.0), (1.0, 4.0), (0.5, 4.0)])
@pytest.mark.parametrize("op", (hvd.Sum, hvd.Average), ids=OP_NAMES.get)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=ids(FLOAT_DTYPES))
def test_prescale_and_postscale(dtype, op, prescale, postscale, mode):
    """prescale multiplies each input, postscale the result (after averaging)."""
    shape = (3, 4)
    got = run(mode, lambda x: hvd.allreduce(x, op=op, prescale_factor=prescale,
                                            postscale_factor=postscale),
              mine(op, shape, dtype))
    assert_exact(got, expected(op, shape, dtype, prescale=prescale, postscale=postscale))


def test_default_op_is_average():
    """With neither op nor average given, allreduce averages."""
    x = mine(hvd.Average, (5,), tf.float32)
    assert_exact(hvd.allreduce(x), expected(hvd.Average, (5,), tf.float32))


@pytest.mark.parametrize("average,op", [(True, hvd.Average), (False, hvd.Sum)])
def test_legacy_average_argument(average, op):
    """average=True means Average and average=False means Sum."""
    x = mine(hvd.Average, (3, 4), tf.float32)
    assert_exact(hvd.allreduce(x, average=average), expected(op, (3, 4), tf.float32))
    (got,) = hvd.grouped_allreduce([x], average=average)
    assert_exact(got, expected(op, (3, 4), tf.float32))


def test_op_and_average_together_is_an_error():
    """Passing both op= and the older average= is ambiguous: ValueError, nothing submitted."""
    x = tf.ones([2])
    with pytest.raises(ValueError, match="not both"):
        hvd.allreduce(x, op=hvd.Sum, average=True)
    with pytest.raises(ValueError, match="not both"):
        hvd.grouped_allreduce([x], op=hvd.Sum, average=False)


@pytest.mark.parametrize("bad_op", [6, -1, "Sum", 1.5])
def test_unknown_op_is_an_error(bad_op):
    """Only Sum, Average, Adasum (2, as in Horovod), Min, Max and Product exist."""
    with pytest.raises(ValueError, match="Unknown reduction op"):
        hvd.allreduce(tf.ones([2]), op=bad_op)
    with pytest.raises(ValueError, match="Unknown reduction op"):
        hvd.grouped_allreduce([tf.ones([2])], op=bad_op)


def test_unsupported_dtype_is_a_type_error():
    """bool and 16/unsigned-wide ints can be broadcast but not reduced."""
    with pytest.raises(TypeError, match="does not support dtype bool"):
        hvd.allreduce(tf.constant([True]))
    with pytest.raises(TypeError, match="does not support dtype uint16"):
        hvd.grouped_allreduce([tf.constant([1], tf.uint16)])


# ---------------------------------------------------------------- integer and float averages

def signed_average_input(rank: int) -> np.ndarray:
    """Values in -3..3 whose sums over ranks are often negative and not multiples of size."""
    i = np.arange(12, dtype=np.int64).reshape(3, 4)
    return (i * (rank + 2)) % 7 - 3


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", SIGNED_INT_DTYPES, ids=ids(SIGNED_INT_DTYPES))
def test_integer_average_rounds_toward_zero(dtype, mode):
    """Integer Average is C++ integer division: -3 / 2 == -1 (not floor's -2)."""
    parts = [signed_average_input(r) for r in range(WORLD_SIZE)]
    want = as_dtype(int_div_toward_zero(np.sum(parts, 0), WORLD_SIZE), dtype)
    got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Average),
              tensor(parts[WORLD_RANK], dtype))
    assert_exact(got, want)
    if WORLD_SIZE > 1:  # the test is only meaningful where some averages are inexact
        sums = np.sum(parts, 0)
        assert (sums % WORLD_SIZE != 0).any() and (sums < 0).any()


def test_uint8_average_truncates():
    """uint8 Average of non-multiples truncates, e.g. (0 + 1 + 1) / 3 == 0."""
    parts = [np.arange(12, dtype=np.int64) * (r + 2) % 7 for r in range(WORLD_SIZE)]
    want = as_dtype(np.sum(parts, 0) // WORLD_SIZE, tf.uint8)
    assert_exact(hvd.allreduce(tensor(parts[WORLD_RANK], tf.uint8), op=hvd.Average), want)


@pytest.mark.parametrize("dtype", (tf.float32, tf.float64), ids=ids((tf.float32, tf.float64)))
def test_float_average_of_inexact_quotients(dtype):
    """float32/float64 Average equals numpy's correctly rounded sum / size."""
    parts = [np.arange(12, dtype=np.int64) % 5 + r for r in range(WORLD_SIZE)]
    nd = np_dtype(dtype)
    want = np.sum(parts, 0).astype(nd) / nd.type(WORLD_SIZE)
    assert_exact(hvd.allreduce(tensor(parts[WORLD_RANK], dtype), op=hvd.Average), want)


# ---------------------------------------------------------------- special shapes and sizes

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS, ids=OP_NAMES.get)
@pytest.mark.parametrize("dtype", (tf.float32, tf.int32, tf.float16),
                         ids=ids((tf.float32, tf.int32, tf.float16)))
def test_empty_tensor(dtype, op, mode):
    """A [0]-shaped tensor reduces to a [0]-shaped tensor of the same dtype."""
    got = run(mode, lambda x: hvd.allreduce(x, op=op), tf.zeros([0], dtype))
    assert_exact(got, np.zeros([0], np_dtype(dtype)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS, ids=OP_NAMES.get)
def test_scalar(op, mode):
    """A rank-0 tensor reduces like any other."""
    got = run(mode, lambda x: hvd.allreduce(x, op=op), mine(op, (), tf.float32))
    assert_exact(got, expected(op, (), tf.float32))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", (hvd.Sum, hvd.Average, hvd.Max), ids=OP_NAMES.get)
def test_large_tensor(op, mode):
    """A 1M-element float32 tensor (4 MB) reduces exactly."""
    shape = (1024, 1024)
    got = run(mode, lambda x: hvd.allreduce(x, op=op), mine(op, shape, tf.float32))
    assert_exact(got, expected(op, shape, tf.float32))


@pytest.mark.parametrize("mode", MODES)
def test_large_grouped_tensors_share_a_fusion_buffer(mode):
    """Two 1M-element tensors plus a small one in one group (one fused buffer)."""
    shapes = [(1 << 20,), (512, 2048), (3,)]
    xs = [mine(hvd.Average, s, tf.float32) for s in shapes]
    got = run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Average,
                                                     prescale_factor=0.5, postscale_factor=4.0),
              *xs)
    for g, s in zip(got, shapes):
        assert_exact(g, expected(hvd.Average, s, tf.float32, prescale=0.5, postscale=4.0), str(s))


# ---------------------------------------------------------------- grouped_allreduce

GROUP = [  # (shape, dtype): several shapes, mixed and interleaved dtypes
    ((5,), tf.float32), ((3, 4), tf.int32), ((2, 3, 2), tf.float32), ((), tf.float64),
    ((0,), tf.int32), ((4,), tf.bfloat16), ((2, 2), tf.uint8), ((6,), tf.float16),
    ((3,), tf.int8), ((2, 5), tf.int64),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", OPS, ids=OP_NAMES.get)
def test_grouped_allreduce_mixed_dtypes_in_input_order(op, mode):
    """Results come back in input order with each input's dtype and shape."""
    xs = [mine(op, s, d) for s, d in GROUP]
    got = run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=op, name="group"), *xs)
    assert len(got) == len(GROUP)
    for g, (s, d) in zip(got, GROUP):
        assert_exact(g, expected(op, s, d), f"{d.name}{list(s)}")


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_with_scales(mode):
    """Scale factors apply to every tensor of every dtype group."""
    group = [(s, d) for s, d in GROUP if d.is_floating]
    xs = [mine(hvd.Sum, s, d) for s, d in group]
    got = run(mode, lambda *t: hvd.grouped_allreduce(list(t), op=hvd.Sum, prescale_factor=0.5,
                                                     postscale_factor=4.0), *xs)
    for g, (s, d) in zip(got, group):
        assert_exact(g, expected(hvd.Sum, s, d, prescale=0.5, postscale=4.0), f"{d.name}{list(s)}")


def test_grouped_allreduce_of_nothing():
    """An empty list submits nothing and returns an empty list."""
    assert hvd.grouped_allreduce([]) == []


# ---------------------------------------------------------------- many ops in one graph

MANY = [((k % 5 + 1, k % 3 + 1), (tf.float32, tf.int32, tf.float16, tf.float64)[k % 4])
        for k in range(50)]


def test_many_named_allreduces_in_one_function():
    """50 concurrent allreduces of mixed dtypes/shapes in one graph (fusion path)."""
    xs = [mine(hvd.Sum, s, d) for s, d in MANY]

    @tf.function
    def step(*inputs):
        return [hvd.allreduce(x, op=hvd.Sum, name=f"many_{k}") for k, x in enumerate(inputs)]

    got = step(*xs)
    for k, (g, (s, d)) in enumerate(zip(got, MANY)):
        assert_exact(g, expected(hvd.Sum, s, d), f"many_{k}")


def test_repeated_calls_of_one_function_see_new_inputs():
    """Calling one traced function again (response-cache fast path) reduces the new values."""
    @tf.function
    def step(*inputs):
        return [hvd.allreduce(x, op=hvd.Sum) for x in inputs]

    for call in range(5):
        parts = {r: [np.full(s, r + call, np.int64) + np.arange(int(np.prod(s))).reshape(s) % 3
                     for s, _ in MANY[:10]] for r in range(WORLD_SIZE)}
        got = step(*[tensor(p, d) for p, (_, d) in zip(parts[WORLD_RANK], MANY[:10])])
        for k, (s, d) in enumerate(MANY[:10]):
            want = reduce_exact(hvd.Sum, [parts[r][k] for r in range(WORLD_SIZE)], d)
            assert_exact(got[k], want, f"call {call} tensor {k}")


def test_hundred_separate_allreduces_feed_outputs_and_consumers():
    """100 separate allreduces in one function, half returned as outputs and half
    consumed inside it, called repeatedly: each completion reaches its consumers
    (Note [completions on the framework's pool])."""
    @tf.function
    def step(scale):
        outs = [hvd.allreduce(tf.fill([3], (WORLD_RANK + 1) * scale + float(k)), op=hvd.Sum,
                              name=f"hundred_{k}") for k in range(100)]
        return outs[:50], tf.add_n(outs[50:])

    ranks_sum = WORLD_SIZE * (WORLD_SIZE + 1) / 2
    for call in range(1, 4):
        returned, consumed = step(tf.constant(float(call)))
        for k, got in enumerate(returned):
            assert_exact(got, np.full(3, ranks_sum * call + WORLD_SIZE * k, np.float32),
                         f"call {call} output {k}")
        want = sum(ranks_sum * call + WORLD_SIZE * k for k in range(50, 100))
        assert_exact(consumed, np.full(3, want, np.float32), f"call {call} sum")


def test_a_collective_whose_result_one_rank_ignores_runs_on_every_rank():
    """Rank 0 returns the sum; the others trace the same collective but ignore
    its result. It must run everywhere (as in Horovod), or rank 0 would wait for
    ranks that pruned it; the others' own later collective checks they ran it."""
    @tf.function
    def step(x):
        total = hvd.allreduce(x, op=hvd.Sum, name="ignored_by_some")
        return total if WORLD_RANK == 0 else x * 2.0

    got = step(tf.constant([1.0 + WORLD_RANK]))
    want = [sum(1.0 + r for r in range(WORLD_SIZE))] if WORLD_RANK == 0 else [2.0 + 2 * WORLD_RANK]
    assert_exact(got, np.array(want, np.float32))
    after = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum, name="after_ignored")
    assert_exact(after, np.array([float(WORLD_SIZE)], np.float32))


def test_eager_allreduce_inside_a_py_function_of_a_function():
    """A py_function holds one of TensorFlow's inter-op threads while an eager
    allreduce inside it waits: that completion must not need the held pool."""
    def body(x):
        return hvd.allreduce(x, op=hvd.Sum, name="inside_py_function").numpy()

    @tf.function
    def step(x):
        y = tf.py_function(body, [x], tf.float32)
        y.set_shape(x.shape)
        return hvd.allreduce(y, op=hvd.Sum, name="after_py_function")

    got = step(tf.fill([4], float(WORLD_RANK + 1)))
    assert_exact(got, np.full(4, WORLD_SIZE * WORLD_SIZE * (WORLD_SIZE + 1) / 2, np.float32))


# ---------------------------------------------------------------- wire compression

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("compression, wire", [(hvd.Compression.fp16, np.float16),
                                               (hvd.Compression.bf16, None)],
                         ids=["fp16", "bf16"])
def test_compression_sends_half_width_and_returns_the_input_dtype(compression, wire, mode):
    """Each rank's float32/float64 values are rounded to the wire type, summed, and
    come back in the input's dtype; integer tensors pass through unchanged."""
    wire = wire or ml_dtypes.bfloat16
    base = np.linspace(0.1, 7.3, 12).reshape(3, 4)
    values = [base * (r + 1) + 1 / 3 for r in range(WORLD_SIZE)]
    for dtype in (tf.float32, tf.float64):
        mine = tf.constant(values[WORLD_RANK], dtype)
        got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum, compression=compression), mine)
        assert got.dtype == dtype
        expected = sum(v.astype(wire) for v in values).astype(wire)  # summed in the wire type
        np.testing.assert_allclose(got.numpy(), expected.astype(np.float64), rtol=1e-2)
        assert not np.array_equal(got.numpy(), sum(values).astype(dtype.as_numpy_dtype))
    ints = run(mode, lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum, compression=compression),
               tf.constant([WORLD_RANK], tf.int32), tf.constant([0.5], tf.float32))
    assert_exact(ints[0], np.array([sum(range(WORLD_SIZE))], np.int32))
    assert ints[1].dtype == tf.float32

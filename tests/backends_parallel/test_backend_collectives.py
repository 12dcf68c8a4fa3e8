"""The collectives on the backend's own tensors (torch tensors, JAX arrays),
exact per rank: every rank contributes values derived from its rank, and
each expected result is computed here from what each rank sent. The same
file runs under KERAS_BACKEND=torch and =jax.
"""

import keras
import numpy as np
import pytest

import hvdkeras as hvd

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8"]


def tensor(values, dtype=None):
    return keras.ops.convert_to_tensor(np.asarray(values), dtype=dtype)


def numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value)).astype(np.float64)


def contribution(rank, shape=(2, 3)):
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) + 2 * rank + 1


def test_names_dispatch_to_the_backend():
    backend = keras.backend.backend()
    assert backend in ("torch", "jax")
    assert hvd.allreduce.__module__ == f"hvdkeras.backends.{backend}.collectives"
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD())
    assert type(optimizer).__mro__[1].__module__ == "hvdkeras.backends.optimizer"
    assert hvd.is_distributed(optimizer)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["Sum", "Average", "Min", "Max"])
def test_allreduce_every_op_and_dtype(dtype, op):
    n, r = hvd.size(), hvd.rank()
    sent = [contribution(k) for k in range(n)]
    got = hvd.allreduce(tensor(sent[r], dtype), op=getattr(hvd, op), name=f"ar.{op}.{dtype}")
    stacked = np.stack(sent)
    expected = {"Sum": stacked.sum(0), "Min": stacked.min(0), "Max": stacked.max(0),
                "Average": stacked.sum(0) / n}[op]
    if op == "Average" and dtype.startswith(("int", "uint")):
        expected = np.trunc(expected)
    assert keras.backend.standardize_dtype(got.dtype) == dtype
    assert numpy(got).shape == (2, 3)
    # The expected value in the dtype's own arithmetic (wrapping, rounding).
    want = numpy(tensor(expected, "float64" if dtype.startswith("float") else "int64"))
    want = numpy(tensor(want, dtype))
    np.testing.assert_array_equal(numpy(got), want)


def test_product_prescale_postscale():
    n, r = hvd.size(), hvd.rank()
    got = numpy(hvd.allreduce(tensor([2.0, 1.0 + r], "float32"), op=hvd.Product))
    assert got.tolist() == [2.0 ** n, float(np.prod([1.0 + k for k in range(n)]))]
    scaled = hvd.allreduce(tensor([1.0, 2.0], "float32") * (r + 1), op=hvd.Sum,
                           prescale_factor=0.5, postscale_factor=3.0)
    total = sum(k + 1 for k in range(n))
    assert numpy(scaled).tolist() == [1.5 * total, 3.0 * total]


def test_grouped_allreduce_mixed_dtypes_and_compression():
    n, r = hvd.size(), hvd.rank()
    inputs = [tensor(np.full((3,), float(r)), "float32"),
              tensor(np.full((2, 2), r + 1), "int64"),
              tensor(np.full((1,), float(r)), "float64")]
    got = hvd.grouped_allreduce(inputs, op=hvd.Sum)
    s = sum(range(n))
    assert [keras.backend.standardize_dtype(g.dtype) for g in got] == [
        "float32", "int64", "float64"]
    assert numpy(got[0]).tolist() == [float(s)] * 3
    assert numpy(got[1]).tolist() == [[s + n] * 2] * 2
    assert numpy(got[2]).tolist() == [float(s)]
    half = hvd.allreduce(tensor([0.5 + r], "float32"), op=hvd.Sum,
                         compression=hvd.Compression.fp16)
    assert keras.backend.standardize_dtype(half.dtype) == "float32"
    assert numpy(half).tolist() == [0.5 * n + s]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "bool"])
def test_broadcast_from_each_root(dtype):
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        def values(k):
            data = contribution(k)
            return data > 3 + k if dtype == "bool" else data
        got = hvd.broadcast(tensor(values(r), dtype), root_rank=root, name=f"bc.{root}.{dtype}")
        np.testing.assert_array_equal(numpy(got), numpy(tensor(values(root), dtype)))


def test_allgather_rows_differ_per_rank():
    n, r = hvd.size(), hvd.rank()
    got = hvd.allgather(tensor(np.full((r + 1, 2), r), "int32"))
    expected = np.concatenate([np.full((k + 1, 2), k) for k in range(n)])
    np.testing.assert_array_equal(numpy(got), expected)
    assert numpy(hvd.allgather(tensor(float(r), "float32"))).tolist() == [
        float(k) for k in range(n)]


def test_reducescatter_uneven_rows():
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1
    base = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2)
    got = hvd.reducescatter(tensor(base * (r + 1), "float32"), op=hvd.Sum)
    total = base * sum(k + 1 for k in range(n))
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    np.testing.assert_array_equal(numpy(got), total[start:start + counts[r]])


def test_grouped_allgather_and_reducescatter_mixed_dtypes():
    n, r = hvd.size(), hvd.rank()
    gathered = hvd.grouped_allgather([tensor(np.full((r + 1, 2), r), "int32"),
                                      tensor(np.full((1,), r + 0.5), "float64")],
                                     name="grouped.gather")
    assert hvd.grouped_allgather.__module__.startswith("hvdkeras.backends.")
    assert keras.backend.standardize_dtype(gathered[0].dtype) == "int32"
    np.testing.assert_array_equal(numpy(gathered[0]),
                                  np.concatenate([np.full((k + 1, 2), k) for k in range(n)]))
    assert numpy(gathered[1]).tolist() == [k + 0.5 for k in range(n)]

    rows = 2 * n + 1
    base = np.arange(rows * 2, dtype=np.float64).reshape(rows, 2)
    mine = hvd.grouped_reducescatter([tensor(base * (r + 1), "float32"),
                                      tensor(np.arange(n) + r, "int32")],
                                     op=hvd.Sum, postscale_factor=2.0, name="grouped.scatter")
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    total = base * sum(k + 1 for k in range(n)) * 2
    np.testing.assert_array_equal(numpy(mine[0]), total[start:start + counts[r]])
    assert numpy(mine[1]).tolist() == [2 * sum(r + k for k in range(n))]
    averaged = hvd.grouped_reducescatter([tensor(np.full((n,), float(r)), "float32")])
    assert numpy(averaged[0]).tolist() == [sum(range(n)) / n]


def test_variables_broadcast_from_the_root():
    r = hvd.rank()
    variables = [keras.Variable(np.full((2, 2), float(r)), dtype="float32"),
                 keras.Variable(r + 5, dtype="int32", trainable=False),
                 keras.Variable(np.full((3,), float(r)), dtype="bfloat16")]
    hvd.broadcast_variables(variables, root_rank=hvd.size() - 1)
    last = hvd.size() - 1
    assert numpy(variables[0].value).tolist() == [[float(last)] * 2] * 2
    assert numpy(variables[1].value).tolist() == last + 5
    assert numpy(variables[2].value).tolist() == [float(last)] * 3


def test_objects_from_each_root_and_from_every_rank():
    n, r = hvd.size(), hvd.rank()
    assert hvd.broadcast_object.__module__ == "hvdkeras.host.objects"
    for root in range(n):
        mine = {"rank": r, "payload": list(range(10 * r + 1))}
        got = hvd.broadcast_object(mine if r == root else None, root_rank=root,
                                   name=f"obj.{root}")
        assert got == {"rank": root, "payload": list(range(10 * root + 1))}
    gathered = hvd.allgather_object(("x" * (r + 1), r), name="objs")
    assert gathered == [("x" * (k + 1), k) for k in range(n)]
    members = [0, n - 1]
    subset = hvd.add_process_set(members) if n > 2 else hvd.global_process_set
    try:
        if r in members:
            assert hvd.allgather_object(r, name="objs.subset",
                                        process_set=subset) == members
    finally:
        if n > 2:
            hvd.remove_process_set(subset)


def test_bf16_compression_rounds_on_the_wire():
    # 1 + 2**-10 survives float16 and is lost in bfloat16's 7-bit mantissa.
    value = tensor([1 + 2 ** -10], "float32")
    half = hvd.allreduce(value, op=hvd.Average, compression=hvd.Compression.fp16)
    brain = hvd.allreduce(value, op=hvd.Average, compression=hvd.Compression.bf16)
    assert numpy(half).tolist() == [1 + 2 ** -10]
    assert numpy(brain).tolist() == [1.0]


def test_a_process_set_reduces_over_its_ranks_only():
    n, r = hvd.size(), hvd.rank()
    members = [0, n - 1] if n > 2 else [n - 1]  # never all ranks: that set exists already
    subset = hvd.add_process_set(members)
    try:
        if r in members:
            got = hvd.allreduce(tensor([float(r + 1)], "float32"), op=hvd.Sum,
                                process_set=subset)
            assert numpy(got).tolist() == [float(sum(k + 1 for k in members))]
    finally:
        hvd.remove_process_set(subset)


def numpy_adasum(values):
    """Adasum of the ranks' arrays, neighbours first, in float64."""
    level = [np.asarray(v, np.float64) for v in values]
    while len(level) > 1:
        paired = []
        for a, b in zip(level[0:-1:2], level[1::2]):
            dot, aa, bb = (a * b).sum(), (a * a).sum(), (b * b).sum()
            paired.append((1 - dot / (2 * aa) if aa > 0 else 1.0) * a
                          + (1 - dot / (2 * bb) if bb > 0 else 1.0) * b)
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def test_adasum_combines_the_ranks_pairwise():
    n, r = hvd.size(), hvd.rank()
    sent = [np.array([[1.0 + k, -2.0 * k, 0.5], [k, 3.0, -1.0]]) * (k + 1) for k in range(n)]
    got = hvd.allreduce(tensor(sent[r], "float64"), op=hvd.Adasum, name="adasum.f64")
    assert keras.backend.standardize_dtype(got.dtype) == "float64"
    np.testing.assert_allclose(numpy(got), numpy_adasum(sent), rtol=1e-12)
    # Grouped, float32, with scaling: prescale each rank's values, postscale the result.
    small = hvd.grouped_allreduce([tensor(sent[r], "float32"), tensor(sent[r][0], "float32")],
                                  op=hvd.Adasum, prescale_factor=0.5, postscale_factor=3.0,
                                  name="adasum.grouped")
    np.testing.assert_allclose(numpy(small[0]), 3 * numpy_adasum([0.5 * v for v in sent]),
                               rtol=1e-5)
    np.testing.assert_allclose(numpy(small[1]), 3 * numpy_adasum([0.5 * v[0] for v in sent]),
                               rtol=1e-5)
    if n == 2:  # orthogonal gradients add up, equal ones are averaged
        orthogonal = hvd.allreduce(tensor([1.0, 0.0] if r == 0 else [0.0, 2.0], "float64"),
                                   op=hvd.Adasum, name="adasum.orthogonal")
        assert numpy(orthogonal).tolist() == [1.0, 2.0]
        same = hvd.allreduce(tensor([3.0, -4.0], "float64"), op=hvd.Adasum, name="adasum.same")
        assert numpy(same).tolist() == [3.0, -4.0]


def test_adasum_optimizer_applies_the_combined_gradients():
    n, r = hvd.size(), hvd.rank()
    grads = [np.array([1.0 + k, -2.0, 0.5 * k], np.float32) for k in range(n)]
    variable = keras.Variable(np.zeros(3, np.float32))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum)
    optimizer.apply([tensor(grads[r], "float32")], [variable])
    np.testing.assert_allclose(numpy(variable.value), -0.1 * numpy_adasum(grads), rtol=1e-5)


def test_local_variables_keep_their_own_gradients():
    """A registered local variable's gradient is not reduced; it is divided by the
    number of ranks (scale_local_gradients, Horovod's default)."""
    n, r = hvd.size(), hvd.rank()
    shared = keras.Variable(np.zeros(2, np.float32))
    local = keras.Variable(np.zeros(2, np.float32))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0))
    optimizer.register_local_var(local)
    grad = np.array([1.0 + r, 2.0], np.float32)
    optimizer.apply([tensor(grad, "float32"), tensor(grad, "float32")], [shared, local])
    mean = np.mean([[1.0 + k, 2.0] for k in range(n)], axis=0)
    np.testing.assert_allclose(numpy(shared.value), -mean, rtol=1e-6)
    np.testing.assert_allclose(numpy(local.value), -grad / n, rtol=1e-6)


def test_uneven_steps_then_join():
    """Rank r runs r + 2 steps, then joins: a rank that has joined counts as
    zeros (averages still divide by every rank), and no rows in allgather.
    Ranks join in order of their step counts, so the last is size - 1."""
    n, r = hvd.size(), hvd.rank()
    assert hvd.join.__module__ == "hvdkeras.host.synchronization"

    def value(rank, step):
        return np.array([rank + 1 + step, 10 * (rank + 1)], np.float64)

    for step in range(r + 2):
        active = [k for k in range(n) if k + 2 > step]
        want = np.sum([value(k, step) for k in active], axis=0)
        total = hvd.allreduce(tensor(value(r, step), "float32"), op=hvd.Sum, name="join.sum")
        mean = hvd.allreduce(tensor(value(r, step), "float32"), name="join.avg")
        ints = hvd.allreduce(tensor(value(r, step), "int32"), op=hvd.Sum, name="join.int")
        rows = hvd.allgather(tensor(np.full((r + 1, 2), r), "int64"), name="join.rows")
        assert numpy(total).tolist() == want.tolist(), (step, active)
        np.testing.assert_array_equal(numpy(mean), numpy(tensor(want / n, "float32")))
        assert numpy(ints).tolist() == want.tolist()
        assert numpy(rows).tolist() == [[k, k] for k in active for _ in range(k + 1)]
    last = hvd.join()
    assert last == n - 1
    assert hvd.allgather_object(last, name="join.agree") == [n - 1] * n
    # Join state resets: every rank takes full part again, and a second
    # round in the opposite order ends with rank 0.
    assert numpy(hvd.allreduce(tensor([1.0], "float32"), op=hvd.Sum)).tolist() == [float(n)]
    for _ in range(n - r):
        hvd.allreduce(tensor([1.0], "float32"), op=hvd.Sum, name="join.again")
    assert hvd.join() == 0


def test_join_refuses_a_process_set_in_the_request():
    """Join is global; the host request says so rather than joining one set."""
    from hvdkeras.engine import requests

    with pytest.raises(RuntimeError, match="join is global"):
        requests.submit(requests.JOIN, requests.JOIN_NAME, [], None, 0, process_set=1)


def test_bad_input_is_named_on_every_rank():
    with pytest.raises(TypeError, match="complex64"):
        hvd.allreduce(tensor(np.zeros(2, dtype=np.complex64)))
    with pytest.raises(ValueError, match="Adasum combines floating-point"):
        hvd.allreduce(tensor([1], "int32"), op=hvd.Adasum)
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(tensor([1.0], "float32"), root_rank=hvd.size())
    hvd.barrier()  # every rank is here after its refusals: nothing was left in flight

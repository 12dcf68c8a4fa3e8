"""The collectives on torch tensors (KERAS_BACKEND=torch), exact per rank.

Every rank contributes values derived from its rank, so each expected
result is computed here from what each rank sent.
"""

import keras
import pytest
import torch

import hvdkeras as hvd

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
          torch.int64, torch.uint8, torch.int8]


def contribution(rank, shape=(2, 3), dtype=torch.float32):
    base = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    return (base + 2 * rank + 1).to(dtype)


def test_backend_is_torch_and_names_dispatch():
    assert keras.backend.backend() == "torch"
    assert hvd.allreduce.__module__ == "hvdkeras.backends.torch.collectives"
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD())
    assert type(optimizer).__mro__[1].__module__ == "hvdkeras.backends.torch.optimizer"
    assert hvd.is_distributed(optimizer)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["Sum", "Average", "Min", "Max"])
def test_allreduce_every_op_and_dtype(dtype, op):
    n, r = hvd.size(), hvd.rank()
    sent = [contribution(k, dtype=dtype) for k in range(n)]
    got = hvd.allreduce(sent[r], op=getattr(hvd, op), name=f"ar.{op}.{dtype}")
    stacked = torch.stack([s.to(torch.float64) for s in sent])
    expected = {"Sum": stacked.sum(0), "Min": stacked.min(0).values,
                "Max": stacked.max(0).values, "Average": stacked.sum(0) / n}[op]
    if op == "Average" and not dtype.is_floating_point:
        expected = torch.trunc(expected)
    assert got.dtype == dtype and got.shape == sent[r].shape
    if dtype in (torch.uint8, torch.int8) and op == "Sum":
        expected = stacked.sum(0).to(dtype).to(torch.float64)  # wraps like the dtype
    assert torch.equal(got.to(torch.float64), expected.to(dtype).to(torch.float64))


def test_product_prescale_postscale():
    n, r = hvd.size(), hvd.rank()
    got = hvd.allreduce(torch.tensor([2.0, 1.0 + r]), op=hvd.Product)
    expected1 = 1.0
    for k in range(n):
        expected1 *= 1.0 + k
    assert got.tolist() == [2.0 ** n, expected1]
    scaled = hvd.allreduce(torch.tensor([1.0, 2.0]) * (r + 1), op=hvd.Sum,
                           prescale_factor=0.5, postscale_factor=3.0)
    total = sum(k + 1 for k in range(n))
    assert scaled.tolist() == [1.5 * total, 3.0 * total]


def test_grouped_allreduce_mixed_dtypes_and_compression():
    n, r = hvd.size(), hvd.rank()
    inputs = [torch.full((3,), float(r)), torch.full((2, 2), r + 1, dtype=torch.int64),
              torch.full((1,), float(r), dtype=torch.float64)]
    got = hvd.grouped_allreduce(inputs, op=hvd.Sum)
    s = sum(range(n))
    assert [g.dtype for g in got] == [torch.float32, torch.int64, torch.float64]
    assert got[0].tolist() == [float(s)] * 3
    assert got[1].tolist() == [[s + n] * 2] * 2
    assert got[2].tolist() == [float(s)]
    half = hvd.allreduce(torch.tensor([0.5 + r], dtype=torch.float32), op=hvd.Sum,
                         compression=hvd.Compression.fp16)
    assert half.dtype == torch.float32 and half.tolist() == [0.5 * n + s]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool],
                         ids=str)
def test_broadcast_from_each_root(dtype):
    n, r = hvd.size(), hvd.rank()
    for root in range(n):
        mine = contribution(r, dtype=torch.float32)
        mine = (mine > 3 + r) if dtype == torch.bool else mine.to(dtype)
        got = hvd.broadcast(mine, root_rank=root, name=f"bc.{root}.{dtype}")
        theirs = contribution(root, dtype=torch.float32)
        theirs = (theirs > 3 + root) if dtype == torch.bool else theirs.to(dtype)
        assert torch.equal(got, theirs)
    target = torch.full((4,), float(r))
    assert hvd.broadcast_(target, root_rank=n - 1) is target
    assert target.tolist() == [float(n - 1)] * 4


def test_allgather_rows_differ_per_rank():
    n, r = hvd.size(), hvd.rank()
    got = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int32))
    expected = torch.cat([torch.full((k + 1, 2), k, dtype=torch.int32) for k in range(n)])
    assert torch.equal(got, expected)
    assert hvd.allgather(torch.tensor(float(r))).tolist() == [float(k) for k in range(n)]


def test_reducescatter_uneven_rows():
    n, r = hvd.size(), hvd.rank()
    rows = 2 * n + 1
    mine = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * (r + 1)
    got = hvd.reducescatter(mine, op=hvd.Sum)
    total = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2) * sum(
        k + 1 for k in range(n))
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    start = sum(counts[:r])
    assert torch.equal(got, total[start:start + counts[r]])


def test_alltoall_uneven_splits():
    n, r = hvd.size(), hvd.rank()
    splits = [k + 1 for k in range(n)]  # k+1 rows to rank k
    rows = torch.cat([torch.full((k + 1,), 100 * r + k) for k in range(n)])
    got, received = hvd.alltoall(rows, splits=splits)
    assert received.tolist() == [r + 1] * n
    assert got.tolist() == [100 * k + r for k in range(n) for _ in range(r + 1)]


def test_gradients_follow_the_exact_convention():
    n, r = hvd.size(), hvd.rank()
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    (hvd.allreduce(x * (r + 1), op=hvd.Sum).sum() * (r + 1)).backward()
    total = sum(k + 1 for k in range(n))
    assert x.grad.tolist() == [total * (r + 1)] * 2
    y = torch.tensor([3.0], requires_grad=True)
    (hvd.broadcast(y, root_rank=0) * (r + 1)).sum().backward()
    assert y.grad.tolist() == ([float(total)] if r == 0 else [0.0])
    z = torch.full((r + 1,), 1.0, requires_grad=True)
    gathered = hvd.allgather(z)
    (gathered * torch.arange(gathered.shape[0], dtype=torch.float32)).sum().backward()
    start = sum(k + 1 for k in range(r))
    assert z.grad.tolist() == [float(n * (start + i)) for i in range(r + 1)]


def test_compiled_function_runs_the_collective():
    r, n = hvd.rank(), hvd.size()

    @torch.compile(backend="eager", fullgraph=False)
    def step(t):
        return hvd.allreduce(t * 2, op=hvd.Sum, name="compiled") + 1

    assert step(torch.full((3,), float(r))).tolist() == [2.0 * sum(range(n)) + 1] * 3


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="complex64"):
        hvd.allreduce(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.zeros(hvd.size() + 1), splits=[1] * hvd.size())
    with pytest.raises(ValueError, match="Adasum"):
        hvd.allreduce(torch.zeros(2), op=hvd.Adasum)
    hvd.barrier()  # every rank is here after its refusals: nothing was left in flight

"""What only the PyTorch binding does: alltoall, in-place broadcast,
autograd through the custom ops, `torch.compile`. Exact per rank."""

import keras
import pytest

import hvdkeras as hvd

if keras.backend.backend() != "torch":
    pytest.skip("PyTorch backend only", allow_module_level=True)

import torch  # noqa: E402  (after the skip: absent under the other backends)


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


def test_in_place_broadcast():
    r, n = hvd.rank(), hvd.size()
    target = torch.full((4,), float(r))
    assert hvd.broadcast_(target, root_rank=n - 1) is target
    assert target.tolist() == [float(n - 1)] * 4


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.zeros(hvd.size() + 1), splits=[1] * hvd.size())
    hvd.barrier()  # every rank is here after its refusals: nothing was left in flight


def test_the_optimizer_averages_gradients_in_place():
    """Eagerly the distributed optimizer reduces the gradient tensors it is
    given into themselves, as Horovod's and DDP's reduce `.grad`; a gradient
    that autograd still tracks is left alone and reduced into a new tensor."""
    n, r = hvd.size(), hvd.rank()
    mean = sum(k + 1 for k in range(n)) / n
    variables = [keras.Variable([0.0, 0.0, 0.0]), keras.Variable([0.0])]
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), name="in_place")
    grads = [torch.full((3,), float(r + 1)), torch.full((1,), float(r + 1))]
    with torch.no_grad():
        optimizer.apply(grads, variables)
    assert [g.tolist() for g in grads] == [[mean] * 3, [mean]]
    assert keras.ops.convert_to_numpy(variables[0]).tolist() == [-mean] * 3

    tracked = torch.full((1,), float(r + 1), requires_grad=True) * 1.0
    with torch.no_grad():
        optimizer.apply([torch.zeros(3), tracked], variables)
    assert tracked.tolist() == [float(r + 1)]  # not written
    assert keras.ops.convert_to_numpy(variables[1]).tolist() == [-2 * mean]

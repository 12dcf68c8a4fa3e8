"""`hvd.DistributedOptimizer` around `torch.optim` optimizers, with
`horovod.torch`'s semantics (Note [torch.optim gradients reduced by hooks]):
N ranks with batch B end where one process with batch N x B ends, and the
state broadcasts give every rank the root's parameters and optimizer state.
"""

import pytest
import torch

import hvdkeras as hvd

PER_RANK, STEPS = 4, 20


# float64: after 20 steps of SGD with momentum float32's roundoff alone
# reaches 1e-6; in float64 what remains is the algorithm's difference.
DTYPE = torch.float64


def _data(rows, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 6, generator=generator, dtype=DTYPE)
    y = x @ torch.randn(6, 1, generator=generator, dtype=DTYPE) + 0.1
    return x, y


def _model(seed=3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                               torch.nn.Linear(8, 1)).to(DTYPE)


def _mine(tensor, step, micro=0, passes=1):
    """This rank's rows of global micro-batch `micro` of step `step`."""
    n, r = hvd.size(), hvd.rank()
    start = ((step * passes + micro) * n + r) * PER_RANK
    return tensor[start:start + PER_RANK]


def _everyone(tensor, step, micro=0, passes=1):
    n = hvd.size()
    start = (step * passes + micro) * n * PER_RANK
    return tensor[start:start + n * PER_RANK]


OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
}


def _train(make, distributed, passes=1, **settings):
    x, y = _data(STEPS * passes * hvd.size() * PER_RANK)
    model = _model(seed=3 + (1000 * hvd.rank() if distributed else 0))
    optimizer = make(model.parameters())
    if distributed:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             backward_passes_per_step=passes, **settings)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    pick = _mine if distributed else _everyone
    for step in range(STEPS):
        optimizer.zero_grad()
        for micro in range(passes):
            xb, yb = pick(x, step, micro, passes), pick(y, step, micro, passes)
            torch.nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
    return model, optimizer


def _assert_same(model, reference, tolerance=1e-9):
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(got.detach(), want.detach(), rtol=tolerance, atol=tolerance,
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("passes", [1, 2], ids=["one_pass", "two_passes"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_torch_optim_equals_one_process_on_the_global_batch(kind, passes):
    model, optimizer = _train(OPTIMIZERS[kind], distributed=True, passes=passes)
    reference, _ = _train(OPTIMIZERS[kind], distributed=False, passes=passes)
    _assert_same(model, reference)
    assert hvd.is_distributed(optimizer)
    everyone = hvd.allgather_object([p.detach().clone() for p in model.parameters()],
                                    name=f"torch_optim_{kind}_{passes}")
    for other in everyone:
        for a, b in zip(other, everyone[0]):
            assert torch.equal(a, b)


def test_options_keep_the_result():
    """Groups, predivision and a second positional argument (horovod.torch's
    named_parameters) change how the gradients travel, not the weights."""
    reference, _ = _train(OPTIMIZERS["adam"], distributed=False)
    for settings in (dict(num_groups=2), dict(gradient_predivide_factor=2.0)):
        model, _ = _train(OPTIMIZERS["adam"], distributed=True, **settings)
        _assert_same(model, reference)
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         model.named_parameters())
    assert optimizer._hvd_names[0] == "0.weight"


def test_fp16_compression_trains_close_to_one_process():
    model, _ = _train(OPTIMIZERS["sgd_momentum"], distributed=True,
                      compression=hvd.Compression.fp16)
    reference, _ = _train(OPTIMIZERS["sgd_momentum"], distributed=False)
    _assert_same(model, reference, tolerance=5e-3)


def test_synchronize_then_clip_inside_skip_synchronize():
    """Horovod's clipping pattern: the clip sees the averaged gradients."""
    x, y = _data(hvd.size() * PER_RANK)
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    torch.nn.functional.mse_loss(model(_mine(x, 0)), _mine(y, 0)).backward()
    # The hooks started every gradient's request during backward().
    assert len(optimizer._hvd_pending) == len(list(model.parameters()))
    optimizer.synchronize()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with optimizer.skip_synchronize():
        optimizer.step()

    reference = _model()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    want = torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    torch.testing.assert_close(norm, want, rtol=1e-9, atol=1e-9)
    _assert_same(model, reference)


def test_sparse_embedding_gradients_are_gathered():
    torch.manual_seed(0)
    ids = torch.randint(0, 10, (hvd.size() * PER_RANK, 3), generator=torch.Generator()
                        .manual_seed(2))

    def run(distributed, sparse_as_dense=False):
        torch.manual_seed(1)
        table = torch.nn.Embedding(10, 4, sparse=True)
        optimizer = torch.optim.SGD(table.parameters(), lr=0.5)
        if distributed:
            optimizer = hvd.DistributedOptimizer(optimizer, sparse_as_dense=sparse_as_dense)
        rows = _mine(ids, 0) if distributed else ids
        for _ in range(3):
            optimizer.zero_grad()
            table(rows).pow(2).mean().backward()
            optimizer.step()
        return table.weight.detach()

    want = run(False)
    torch.testing.assert_close(run(True), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(run(True, sparse_as_dense=True), want, rtol=1e-6, atol=1e-6)


def test_misuse_is_refused_with_a_clear_error():
    x, y = _data(hvd.size() * PER_RANK)
    model = _model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    loss = torch.nn.functional.mse_loss(model(_mine(x, 0)), _mine(y, 0))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="more than backward_passes_per_step=1"):
        loss.backward()
    with pytest.raises(RuntimeError, match="zero_grad"):
        optimizer.zero_grad()
    optimizer.step()
    with pytest.raises(ValueError, match="already distributed"):
        hvd.DistributedOptimizer(optimizer)
    other = _model()
    with pytest.raises(ValueError, match="not among them"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=other.named_parameters())


def test_broadcasts_give_every_rank_the_root_state():
    x, y = _data(2 * PER_RANK, seed=hvd.rank())
    model = _model(seed=10 + hvd.rank())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (1 + hvd.rank()))
    for _ in range(2 + hvd.rank()):  # each rank's own state, and its own step count
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    state = optimizer.state_dict()
    everyone = hvd.allgather_object(
        ([p.detach().clone() for p in model.parameters()], state["param_groups"][0]["lr"],
         [(float(s["step"]), s["exp_avg"].clone()) for s in state["state"].values()]),
        name="broadcast_state")
    for params, lr, moments in everyone:
        assert lr == 0.01
        for a, b in zip(params, everyone[0][0]):
            assert torch.equal(a, b)
        for (step, avg), (step0, avg0) in zip(moments, everyone[0][2]):
            assert step == step0 == 2.0 and torch.equal(avg, avg0)

"""The torch optimizer reduces gradients while the backward pass runs (Note
[reductions during the backward pass]): results exact against the mean of
every rank's own gradients, whichever way a gradient is reduced (by a hook,
in a bucket sent at apply, or synchronously), the refusals, and the knob.
Under torch only (the harness runs `*_specific` files for their backend)."""

import warnings

import keras
import numpy as np
import pytest

import hvdkeras as hvd

if keras.backend.backend() != "torch":
    pytest.skip("PyTorch backend only", allow_module_level=True)

import torch  # noqa: E402  (after the skip: absent under the other backends)



@pytest.fixture(autouse=True)
def overlap_on(monkeypatch):
    """On, whatever the hosts ("auto" is on only across hosts; see the last tests)."""
    monkeypatch.setenv("HVDKERAS_TORCH_BACKWARD_OVERLAP", "1")


def _inputs(rank: int) -> torch.Tensor:
    return torch.tensor([[1.0 + rank, -2.0, 0.5 * rank], [0.25, rank - 1.0, 3.0]])


def _model_and_optimizer(**kwargs):
    keras.utils.set_random_seed(7)  # the same start on every rank
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(2)])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), **kwargs)
    optimizer.build(model.trainable_variables)
    return model, optimizer


def _own_gradients(model, rank: int):
    """This model's gradients of rank `rank`'s loss, without touching `.grad`."""
    params = [v.value for v in model.trainable_variables]
    loss = (model(_inputs(rank)) ** 2).sum()
    return [g.detach().clone() for g in torch.autograd.grad(loss, params)]


def _mean_gradients(model):
    per_rank = [_own_gradients(model, k) for k in range(hvd.size())]
    return [sum(gs) / hvd.size() for gs in zip(*per_rank)]


def _weights(model):
    return [v.value.detach().clone() for v in model.trainable_variables]


def _backward(model):
    model.zero_grad()
    (model(_inputs(hvd.rank())) ** 2).sum().backward()
    return [v.value.grad for v in model.trainable_variables]


def _assert_stepped(model, before, expected_grads):
    for after, start, grad in zip(_weights(model), before, expected_grads):
        torch.testing.assert_close(after, start - grad, rtol=1e-6, atol=1e-6)


def test_each_bucket_is_sent_by_the_backward_pass(monkeypatch):
    monkeypatch.setenv("HVDKERAS_BUCKET_BYTES", "1")  # one bucket per variable
    model, optimizer = _model_and_optimizer()
    before, expected = _weights(model), _mean_gradients(model)
    optimizer.apply(_backward(model), model.trainable_variables)
    _assert_stepped(model, before, expected)
    assert optimizer._hvdkeras_backward.started_during_backward == 4


def test_one_bucket_and_several_steps():
    model, optimizer = _model_and_optimizer()
    for _ in range(3):
        before, expected = _weights(model), _mean_gradients(model)
        optimizer.apply(_backward(model), model.trainable_variables)
        _assert_stepped(model, before, expected)
    assert optimizer._hvdkeras_backward.started_during_backward == 3


def test_a_variable_without_gradient_leaves_its_bucket_to_apply():
    model, first = _model_and_optimizer()
    unused = keras.Variable(np.ones((2,), "float32"), name="unused")
    variables = [*model.trainable_variables, unused]
    # A second optimizer for the same variables takes their hooks over.
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), name="with_unused")
    optimizer.build(variables)
    for _ in range(2):
        before, expected = _weights(model), _mean_gradients(model)
        optimizer.apply([*_backward(model), None], variables)
        _assert_stepped(model, before, expected)
    assert optimizer._hvdkeras_backward.started_during_backward == 0
    assert first._hvdkeras_backward.started_during_backward == 0
    assert unused.numpy().tolist() == [1.0, 1.0]


def test_a_model_compiled_again_uses_the_new_optimizer_alone():
    model, old = _model_and_optimizer()
    model.compile(optimizer=old, loss="mse")
    x = np.random.default_rng(hvd.rank()).normal(size=(4, 3)).astype("float32")
    model.fit(x, np.zeros((4, 2), "float32"), batch_size=4, verbose=0)
    new = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), name="second_phase")
    model.compile(optimizer=new, loss="mse")
    model.fit(x, np.zeros((4, 2), "float32"), batch_size=4, epochs=2, verbose=0)
    assert (old._hvdkeras_backward.started_during_backward,
            new._hvdkeras_backward.started_during_backward) == (1, 2)


def test_gradients_are_reduced_when_backward_returns():
    # As under DDP: a custom loop that reads, clips or scales `.grad` between
    # backward() and apply() sees the reduced gradients, never a buffer the
    # engine is still writing into.
    model, optimizer = _model_and_optimizer()
    before, expected = _weights(model), _mean_gradients(model)
    grads = _backward(model)
    for grad, mean in zip(grads, expected):
        torch.testing.assert_close(grad, mean, rtol=1e-6, atol=1e-6)
    clipped = [g.clamp_(-0.5, 0.5) for g in grads]  # in place: still the tensors sent
    optimizer.apply(clipped, model.trainable_variables)
    _assert_stepped(model, before, [m.clamp(-0.5, 0.5) for m in expected])


def test_replaced_gradients_are_reduced_in_apply():
    model, optimizer = _model_and_optimizer()
    before, expected = _weights(model), _mean_gradients(model)
    doubled = [g * 2 for g in _backward(model)]
    optimizer.apply(doubled, model.trainable_variables)
    _assert_stepped(model, before, [2 * g for g in expected])


def test_local_variable_keeps_its_own_gradient():
    model, optimizer = _model_and_optimizer()
    local = model.trainable_variables[0]
    optimizer.register_local_var(local)
    before, expected = _weights(model), _mean_gradients(model)
    expected[0] = _own_gradients(model, hvd.rank())[0] / hvd.size()
    optimizer.apply(_backward(model), model.trainable_variables)
    _assert_stepped(model, before, expected)


def test_a_second_backward_before_apply_is_refused():
    model, optimizer = _model_and_optimizer()
    grads = _backward(model)
    with pytest.raises(RuntimeError, match=r"computed twice before optimizer.apply\(\)"):
        (model(_inputs(hvd.rank())) ** 2).sum().backward()
    optimizer.apply(grads, model.trainable_variables)  # what the first pass started ends
    hvd.barrier()


def test_fit_reduces_during_backward_and_ranks_agree():
    model, optimizer = _model_and_optimizer()
    model.compile(optimizer=optimizer, loss="mse")
    x = np.random.default_rng(hvd.rank()).normal(size=(8, 3)).astype("float32")
    model.fit(x, np.zeros((8, 2), "float32"), batch_size=4, epochs=1, verbose=0)
    assert optimizer._hvdkeras_backward.started_during_backward == 2
    for weight in model.get_weights():
        gathered = hvd.allgather(torch.from_numpy(weight[None]))
        assert all(torch.equal(gathered[0], row) for row in gathered)


@pytest.mark.parametrize("settings", [{"num_groups": 2}, {"compression": hvd.Compression.fp16},
                                      {"op": hvd.Adasum}, {"backward_passes_per_step": 2}])
def test_other_settings_reduce_in_apply(settings):
    _, optimizer = _model_and_optimizer(**settings)
    assert optimizer._hvdkeras_backward is None


def test_the_knob_turns_it_off(monkeypatch):
    monkeypatch.setenv("HVDKERAS_TORCH_BACKWARD_OVERLAP", "0")
    model, optimizer = _model_and_optimizer()
    assert optimizer._hvdkeras_backward is None
    before, expected = _weights(model), _mean_gradients(model)
    optimizer.apply(_backward(model), model.trainable_variables)
    _assert_stepped(model, before, expected)


def test_compiled_train_step_keeps_the_hooks_out_of_the_graph():
    model, optimizer = _model_and_optimizer()
    model.compile(optimizer=optimizer, loss="mse", jit_compile=True)  # torch.compile
    x = np.random.default_rng(hvd.rank()).normal(size=(8, 3)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, np.zeros((8, 2), "float32"), batch_size=4, epochs=1, verbose=0)
    untraceable = [str(w.message) for w in caught if "Dynamo does not know" in str(w.message)]
    assert not untraceable, untraceable
    assert optimizer._hvdkeras_backward.started_during_backward == 2
    for weight in model.get_weights():
        gathered = hvd.allgather(torch.from_numpy(weight[None]))
        assert all(torch.equal(gathered[0], row) for row in gathered)


def test_auto_reduces_during_backward_only_across_hosts(monkeypatch):
    monkeypatch.delenv("HVDKERAS_TORCH_BACKWARD_OVERLAP")
    model, optimizer = _model_and_optimizer()
    across_hosts = hvd.local_size() < hvd.size()
    assert (optimizer._hvdkeras_backward is not None) is across_hosts
    before, expected = _weights(model), _mean_gradients(model)
    optimizer.apply(_backward(model), model.trainable_variables)
    _assert_stepped(model, before, expected)

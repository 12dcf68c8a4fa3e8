"""`hvdkeras.DistributedOptimizer` for `torch.optim` optimizers, with
`horovod.torch`'s names and semantics.

Note [torch.optim gradients reduced by hooks]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Each parameter the optimizer updates gets a post-accumulate-grad hook. When
`backward()` has finished a parameter's gradient for the last pass of a
step (`backward_passes_per_step` counts the passes, which accumulate in
`.grad` as torch accumulates them), the hook submits that gradient to the
engine in place, under a name fixed by the parameter (its name from
`named_parameters`, or its position in the optimizer's groups), and returns
at once: the engine fuses the requests that arrive together and reduces
them while autograd computes the layers below. `synchronize()` (called by
`step()` unless inside `skip_synchronize()`) submits what no hook sent (a
parameter without a gradient this step gets zeros, as in Horovod, so every
rank submits the same names), waits for every request within the stall
bound, and writes the results into `.grad`. What a hook cannot hand the
engine in place (a CUDA, sparse or non-contiguous gradient, a group still
waiting for members, Adasum) is reduced there too. The results equal one
process's on the global batch: Average divides the sum by the set's size,
and the passes of a step are summed, as torch sums them.

What may import this module: `hvdkeras.training.optimizer` (which hands it
`torch.optim` optimizers) and the facade.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from hvdkeras import compat
from hvdkeras.backends.gradient_reduction import reduction_scaling
from hvdkeras.backends.torch import collectives
from hvdkeras.backends.torch import ops as torch_ops
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Adasum, Average, Sum
from hvdkeras.host import buffers


def is_distributed(optimizer: Any) -> bool:
    """Whether the `torch.optim` optimizer was made distributed here."""
    return isinstance(optimizer, _TorchOptimMixin)


def parameter_names(optimizer: torch.optim.Optimizer,
                    named_parameters: Optional[Iterable[Tuple[str, Any]]]) -> List[str]:
    """The request name of each parameter the optimizer updates, in its groups' order.

    Args:
        optimizer: The `torch.optim` optimizer.
        named_parameters: `model.named_parameters()`, or None (then positions
            name them: `param.<group>.<index>`).

    Returns:
        One name per parameter, the same on every rank.

    Raises:
        ValueError: a name given twice, a parameter of the optimizer that no
            name covers, or something that is not (name, tensor) pairs.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return [f"param.{g}.{k}" for g, group in enumerate(optimizer.param_groups)
                for k in range(len(group["params"]))]
    pairs = list(named_parameters)
    if any(not (isinstance(pair, tuple) and len(pair) == 2) for pair in pairs):
        raise ValueError("named_parameters should be a sequence of (name, parameter) pairs, "
                         "usually model.named_parameters().")
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"named_parameters holds these names more than once: {repeated}; "
                         "each parameter needs its own name.")
    by_id = {id(p): name for name, p in pairs}
    unnamed = [k for k, p in enumerate(params) if id(p) not in by_id]
    if unnamed:
        raise ValueError(
            f"named_parameters names {len(pairs)} tensors, but {len(unnamed)} of the "
            "optimizer's parameters are not among them (positions "
            f"{unnamed[:5]}{'...' if len(unnamed) > 5 else ''}). Pass the named_parameters() "
            "of the model whose parameters() the optimizer was made with.")
    return [by_id[id(p)] for p in params]


def _groups_of(params: List[Any], num_groups: int,
               groups: Optional[Sequence[Sequence[Any]]]) -> List[List[int]]:
    """Positions of `params` reduced together (one request each); every
    position appears once. Without groups, each parameter alone."""
    if groups is not None:
        index = {id(p): k for k, p in enumerate(params)}
        planned, taken = [], set()
        for group in groups:
            members = sorted(index[id(p)] for p in group if id(p) in index)
            missing = [p for p in group if id(p) not in index]
            if missing:
                raise ValueError("groups lists tensors the optimizer does not update; build "
                                 "groups from the optimizer's parameters.")
            members = [k for k in members if k not in taken]
            taken.update(members)
            if members:
                planned.append(members)
        return planned + [[k] for k in range(len(params)) if k not in taken]
    if num_groups > 0:
        count = min(num_groups, len(params))
        base, extra = divmod(len(params), count)
        planned, start = [], 0
        for g in range(count):
            end = start + base + (1 if g < extra else 0)
            planned.append(list(range(start, end)))
            start = end
        return planned
    return [[k] for k in range(len(params))]


class _TorchOptimMixin:
    """Placed in front of the user's `torch.optim` class (see the module's Note)."""

    def _hvd_hook(self, position: int):
        def ready(param: torch.Tensor) -> None:
            self._hvd_gradient_ready(position, param)
        return ready

    def _hvd_gradient_ready(self, position: int, param: torch.Tensor) -> None:
        if param.grad is None:
            return
        if self._hvd_delay[position] <= 0:
            raise RuntimeError(
                f"hvdkeras: the gradient of {self._hvd_names[position]!r} was computed more "
                f"than backward_passes_per_step={self.backward_passes_per_step} times before "
                "optimizer.step() or optimizer.synchronize(). Raise backward_passes_per_step "
                "to accumulate more passes locally.")
        self._hvd_delay[position] -= 1
        if self._hvd_delay[position] > 0:
            return
        group = self._hvd_group_of[position]
        if all(self._hvd_delay[k] == 0 for k in self._hvd_groups[group]):
            self._hvd_send(group, at_synchronize=False)

    def _hvd_send(self, group: int, at_synchronize: bool) -> None:
        """Starts the group's request where its gradients can be reduced in
        place; otherwise leaves it for `synchronize` (which calls this again)."""
        members = self._hvd_groups[group]
        grads = []
        for k in members:
            param = self._hvd_params[k]
            if param.grad is None:
                if not at_synchronize:
                    return
                param.grad = torch.zeros_like(param)
            grads.append(param.grad)
        in_place = (self._hvd_settings["op"] in (Average, Sum)
                    and all(g.device.type == "cpu" and not g.is_sparse and g.is_contiguous()
                            for g in grads)
                    and len({g.dtype for g in grads}) == 1)
        if not in_place:
            if at_synchronize:
                self._hvd_reduce_now(members)
            return
        wires = [self._hvd_wire(g) for g in grads]
        name = f"{self._hvd_settings['name']}.{self._hvd_names[members[0]]}"
        if len(members) > 1:
            name += f".group{group}"
        pending = buffers.submit_allreduce(
            [torch_ops.describe(w, "allreduce") for w in wires], [w.data_ptr() for w in wires],
            name, *self._hvd_scaling, self._hvd_set_id, keep=wires)
        self._hvd_pending[group] = (pending, members, wires)

    def _hvd_wire(self, grad: torch.Tensor) -> torch.Tensor:
        """The tensor that travels: the gradient itself, or its half-width copy."""
        wire = getattr(self._hvd_settings["compression"], "wire_dtype", None)
        if wire is not None and grad.is_floating_point():
            dtype = getattr(torch, wire)
            if grad.dtype != dtype:
                return grad.to(dtype)
        return grad

    def _hvd_reduce_now(self, members: List[int]) -> None:
        """Reduces gradients a hook could not send in place, at once."""
        settings = self._hvd_settings
        size = process_sets.view(settings["process_set"]).size
        for k in members:
            param, name = self._hvd_params[k], f"{settings['name']}.{self._hvd_names[k]}"
            grad = param.grad
            if grad.is_sparse and not settings["sparse_as_dense"]:
                param.grad = _sparse_average(grad, name, settings, size)
                continue
            if grad.is_sparse:
                grad = grad.to_dense()
            op, prescale, postscale = self._hvd_scaling
            reduced = collectives.allreduce(
                grad, name=name, op=op, prescale_factor=prescale, postscale_factor=postscale,
                compression=settings["compression"], process_set=settings["process_set"])
            with torch.no_grad():
                if param.grad.is_sparse:
                    param.grad = reduced
                else:
                    param.grad.copy_(reduced)

    def synchronize(self) -> None:
        """Finishes every gradient's reduction; `.grad` then holds the results.

        Call it yourself (then step inside `skip_synchronize()`) to clip or
        read the reduced gradients before the update, as with Horovod.
        """
        for group in range(len(self._hvd_groups)):
            if group not in self._hvd_pending:
                self._hvd_send(group, at_synchronize=True)
        pending, self._hvd_pending = self._hvd_pending, {}
        for request, members, wires in pending.values():
            with request.wait():
                pass
            for k, wire in zip(members, wires):
                grad = self._hvd_params[k].grad
                if wire is not grad:
                    with torch.no_grad():
                        grad.copy_(wire)
        self._hvd_delay = [self.backward_passes_per_step] * len(self._hvd_params)
        self._hvd_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside, `step()` applies `.grad` as it is (after your own `synchronize()`)."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    def step(self, closure=None):
        if self._hvd_should_synchronize:
            if self._hvd_synchronized:
                warnings.warn("optimizer.step() after optimizer.synchronize() outside "
                              "optimizer.skip_synchronize(): the gradients are reduced again. "
                              "Step inside `with optimizer.skip_synchronize():`.", stacklevel=2)
            self.synchronize()
        self._hvd_synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._hvd_pending:
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() and before "
                "optimizer.step() or optimizer.synchronize(): the gradients are still being "
                "reduced across ranks. Call step() (or synchronize()) first.")
        return super().zero_grad(set_to_none=set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Changes how many backward passes each step accumulates (between steps)."""
        _check_passes(passes)
        self.backward_passes_per_step = int(passes)
        self._hvd_delay = [self.backward_passes_per_step] * len(self._hvd_params)


def _sparse_average(grad: torch.Tensor, name: str, settings: Dict[str, Any],
                    size: int) -> torch.Tensor:
    """A sparse gradient reduced by gathering every rank's entries (torch's
    optimizers coalesce repeats, so this is the sum of the ranks' rows)."""
    grad = grad.coalesce()
    indices = collectives.allgather(grad.indices().t().contiguous(), name=f"{name}.indices",
                                    process_set=settings["process_set"])
    values = collectives.allgather(grad.values(), name=f"{name}.values",
                                   process_set=settings["process_set"])
    scale = 1.0 / size if settings["op"] == Average else 1.0
    return torch.sparse_coo_tensor(indices.t(), values * scale, grad.shape,
                                   check_invariants=True).coalesce()


def _check_passes(passes: Any) -> None:
    if not isinstance(passes, int) or passes < 1:
        raise ValueError(f"backward_passes_per_step must be an integer >= 1, got {passes!r}.")


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Optional[Iterable[Tuple[str, Any]]] = None,
                         compression: Any = None, backward_passes_per_step: int = 1,
                         op: int = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Optional[Sequence[Sequence[Any]]] = None,
                         sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set,
                         name: Optional[str] = None) -> torch.optim.Optimizer:
    """Makes a `torch.optim` optimizer average gradients across ranks, as
    `horovod.torch.DistributedOptimizer` does.

    `hvdkeras.DistributedOptimizer` hands `torch.optim` optimizers here. The
    optimizer is converted in place (its state is kept) and returned.

    Args:
        optimizer: A `torch.optim.Optimizer`.
        named_parameters: `model.named_parameters()`: names the requests (and
            checks that every parameter of the optimizer is named).
        compression: `hvdkeras.Compression.fp16` or `.bf16` on the wire.
        backward_passes_per_step: Backward passes accumulated locally per
            `step()`; the hooks reduce on the last one (the passes' sum).
        op: `hvdkeras.Average` (default), `hvdkeras.Sum` or `hvdkeras.Adasum`.
        gradient_predivide_factor: Average as a sum times 1/f before and
            f/size after (Average only).
        num_groups: Reduce the parameters in this many contiguous groups, one
            request each, once all of a group's gradients are ready.
        groups: Explicit groups: lists of parameters reduced together.
        sparse_as_dense: Densify sparse gradients (`Embedding(sparse=True)`)
            before reducing; otherwise they are gathered.
        process_set: Reduce over this set's ranks only.
        name: Prefix of the request names (the same on every rank).

    Returns:
        The optimizer, with `synchronize()`, `skip_synchronize()` and
        `set_backward_passes_per_step()`.

    Example:

    ```python
    opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    ```
    """
    if isinstance(optimizer, _TorchOptimMixin):
        raise ValueError("This torch optimizer is already distributed; wrap it once.")
    _check_passes(backward_passes_per_step)
    if op not in (Average, Sum, Adasum):
        raise ValueError(f"DistributedOptimizer takes op=hvdkeras.Average, Sum or Adasum for "
                         f"torch.optim optimizers, got {op!r}.")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=hvdkeras.Average.")
    if num_groups and groups is not None:
        raise ValueError("Pass either num_groups or groups, not both.")
    view = process_sets.view(process_set)  # a clear error for an unregistered set
    names = parameter_names(optimizer, named_parameters)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    settings = {"name": name or "DistributedOptimizer", "compression": compression,
                "op": op, "gradient_predivide_factor": float(gradient_predivide_factor),
                "sparse_as_dense": bool(sparse_as_dense), "process_set": process_set}
    planned = _groups_of(params, int(num_groups), groups)
    optimizer.__class__ = compat.with_mixin(_TorchOptimMixin, type(optimizer))
    optimizer.backward_passes_per_step = int(backward_passes_per_step)
    optimizer._hvd_settings = settings
    optimizer._hvd_scaling = reduction_scaling(settings, view.size)
    optimizer._hvd_set_id = view.set_id
    optimizer._hvd_params = params
    optimizer._hvd_names = names
    optimizer._hvd_groups = planned
    optimizer._hvd_group_of = {k: g for g, members in enumerate(planned) for k in members}
    optimizer._hvd_delay = [int(backward_passes_per_step)] * len(params)
    optimizer._hvd_pending = {}
    optimizer._hvd_should_synchronize = True
    optimizer._hvd_synchronized = False
    optimizer._hvd_hooks = [p.register_post_accumulate_grad_hook(optimizer._hvd_hook(k))
                            for k, p in enumerate(params) if p.requires_grad]
    return optimizer

"""Gradients reduced while the backward pass goes on (torch backend).

Note [reductions during the backward pass]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Keras's torch trainer runs `loss.backward()` to the end, then calls
`optimizer.apply(grads)`. Reducing only there leaves the network idle for the
whole backward pass and the CPU waiting for the reduction. As Horovod's and
DDP's PyTorch front-ends do, the distributed optimizer hooks each variable's
tensor (`register_post_accumulate_grad_hook`). The gradients fill buckets
(Note [gradient buckets] in hvdkeras/engine/buckets.py) in the order autograd
produces them; once all of a bucket's gradients are finished, the
hook hands the bucket to the engine as one request, reduced in place in the
gradients' own buffers under a name fixed by the bucket's position, and
returns at once, while autograd computes the layers below. One request per
bucket rather than per gradient: each request costs the engine a
negotiation, and on a busy CPU those cycles are taken from the backward pass.

The first hook of a pass also asks autograd to call back when the pass ends
(as DDP does): the callback sends the buckets some of whose gradients never
came (a variable without a gradient this step) and waits for every request,
so when `backward()` returns the gradients already hold the reduced values.
Nothing can read a gradient while the engine writes into it: a custom loop
that clips or scales `.grad` between `backward()` and `apply()` works on the
reduced gradients, as it would under DDP. `apply` then reduces the rest, as
before, in one fused request: gradients of local variables, gradients that
are not the tensors autograd filled (a loop that replaced them), and
gradients no hook sent.

The hooks fire on every backward pass. A second pass before `apply` would
accumulate into buffers the engine is reducing, so it is refused, naming the
variable (Horovod's PyTorch optimizer does the same): accumulate with
`backward_passes_per_step`, or add the losses before one backward pass.
Only a plain Average or Sum of uncompressed gradients, one pass per update,
is reduced this way (`eligible`); the other settings (groups, compression,
Adasum, accumulation) reduce in `apply`, as under jax.
`HVDKERAS_TORCH_BACKWARD_OVERLAP` says when: `auto` (the default) with ranks
on several hosts (on one host the reduction takes the backward pass's cores),
`1` always, `0` never.

What may import this module: `hvdkeras.backends.optimizer`.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Sequence, Set, Tuple

import torch

from hvdkeras import compat
from hvdkeras.engine import buckets, process_sets
from hvdkeras.engine.requests import Pending
from hvdkeras.engine.types import Average, Sum
from hvdkeras.backends.torch import ops as torch_ops
from hvdkeras.host import buffers


def eligible(settings: Dict[str, Any], enabled: bool) -> bool:
    """Whether the optimizer's settings allow reducing during the backward pass.

    Args:
        settings: The distributed optimizer's settings (`hvdkeras.backends.optimizer`).
        enabled: The `HVDKERAS_TORCH_BACKWARD_OVERLAP` knob.

    Returns:
        True for an uncompressed Average or Sum in one fused group, one pass per update,
        state not sharded (`zero_stage` 0).

    Example:
        >>> eligible({"op": Average, "passes": 1, "groups": None, "num_groups": 0,
        ...           "compression": None}, enabled=True)
        True
    """
    compression = getattr(settings["compression"], "name", "none")
    return (enabled and settings["op"] in (Average, Sum) and settings["passes"] == 1
            and not settings.get("zero_stage")
            and settings["groups"] is None and settings["num_groups"] in (0, 1)
            and compression == "none")


# The optimizer whose hooks act on a tensor: the one built for it last. A
# model compiled again with a new distributed optimizer keeps the old one's
# hooks; they stand down (the old optimizer, if applied again, reduces in
# `apply`), so a stale optimizer never holds back or refuses a pass.
_owners: "weakref.WeakValueDictionary[int, BackwardReductions]" = weakref.WeakValueDictionary()


class BackwardReductions:
    """The hooks of one optimizer's variables and the requests they started.

    Args:
        variables: The variables the optimizer was built for (their order
            names the requests, identically on every rank).
        settings: The optimizer's settings.
        scaling: The engine's (op, prescale, postscale) for the reduction
            (`reduction_scaling` in `hvdkeras.backends.optimizer`).
        local_ids: `id()`s of the variables whose gradients stay local (read
            when a hook fires, so later registrations count).
    """

    def __init__(self, variables: Sequence[Any], settings: Dict[str, Any],
                 scaling: Tuple[int, float, float], local_ids: Set[int]):
        self._settings = settings
        self._local_ids = local_ids
        self._variables = list(variables)
        self._position_of = {id(v): p for p, v in enumerate(self._variables)}
        self._op, self._pre, self._post = scaling
        self._set_id = process_sets.view(settings["process_set"]).set_id
        tensors = [getattr(v, "value", None) for v in self._variables]
        hooked = [p for p, t in enumerate(tensors)
                  if isinstance(t, torch.Tensor) and t.requires_grad]
        sizes = [tensors[p].numel() * tensors[p].element_size() for p in hooked]
        limit = buckets.bucket_limit()
        groups = buckets.buckets(sizes, [str(tensors[p].dtype) for p in hooked], limit,
                                 min(limit, buckets.FIRST_BUCKET_BYTES))
        self._buckets = [[hooked[k] for k in group] for group in groups]
        self._bucket_of = {p: b for b, group in enumerate(self._buckets) for p in group}
        self._ready: Dict[int, torch.Tensor] = {}  # position -> gradient, this step
        self._pending: List[Tuple[Pending, List[int], List[torch.Tensor]]] = []
        self._started: Set[int] = set()  # buckets sent this step
        self._sent: Dict[int, torch.Tensor] = {}  # position -> reduced gradient, this step
        self._end_queued = False  # whether this pass's end calls `_complete`
        self.started_during_backward = 0  # requests a hook started (tests, stats)
        for p in hooked:
            _owners[id(tensors[p])] = self
            tensors[p].register_post_accumulate_grad_hook(self._hook(p))

    def _hook(self, position: int):
        # Run as it is, never traced: under torch.compile (Keras's
        # jit_compile) Dynamo would otherwise trace into the engine's ctypes
        # calls, warn and break the graph there.
        @torch.compiler.disable
        def ready(tensor: torch.Tensor) -> None:
            if _owners.get(id(tensor)) is self:
                self._gradient_ready(position, tensor.grad)
        return ready

    def _gradient_ready(self, position: int, grad: Any) -> None:
        variable = self._variables[position]
        if id(variable) in self._local_ids or grad is None:
            return
        if position in self._ready:
            raise RuntimeError(
                f"hvdkeras: the gradient of {variable.path!r} was computed twice before "
                "optimizer.apply(): the first is being reduced across ranks. Accumulate "
                "with DistributedOptimizer(backward_passes_per_step=N), or add the losses "
                "before one backward pass.")
        # A CUDA gradient goes as it is: the hook runs on the stream that made
        # it, and the engine's stream waits for an event recorded there
        # (Note [stream order] in ops/core/device.h).
        if grad.device.type not in ("cpu", "cuda") or grad.is_sparse or not grad.is_contiguous():
            return  # apply reduces it (and says what it cannot take)
        self._ready[position] = grad
        if not self._end_queued:
            self._end_queued = True
            compat.torch_at_end_of_backward(self._complete)
        bucket = self._bucket_of[position]
        members = [p for p in self._buckets[bucket]
                   if id(self._variables[p]) not in self._local_ids]
        if all(p in self._ready for p in members):
            self._send(bucket, members)
            self.started_during_backward += 1

    def _send(self, bucket: int, members: List[int]) -> None:
        grads = [self._ready[p] for p in members]
        inputs = [torch_ops.describe(g, "allreduce") for g in grads]
        addresses = [g.data_ptr() for g in grads]
        pending = buffers.submit_allreduce(
            inputs, addresses, f"{self._settings['name']}.backward.{bucket}", self._op,
            self._pre, self._post, self._set_id, keep=grads)
        self._pending.append((pending, members, grads))
        self._started.add(bucket)

    @torch.compiler.disable  # at the end of a compiled backward: run as it is
    def _complete(self) -> None:
        """Sends the buckets some of whose gradients are ready and waits for
        every request of this step (the end of the backward pass, or `finish`)."""
        self._end_queued = False
        for bucket, group in enumerate(self._buckets):
            members = [p for p in group if p in self._ready]
            if bucket not in self._started and members:
                self._send(bucket, members)
        pending, self._pending = self._pending, []
        for request, members, tensors in pending:
            with request.wait():
                pass
            self._sent.update(zip(members, tensors))

    @torch.compiler.disable  # inside Keras's compiled step: run as it is (see _hook)
    def finish(self, grads: List[Any], variables: Sequence[Any]) -> Set[int]:
        """Ends this step's requests (if the backward pass has not) and returns
        the indices into `grads` that hold their reduced gradient already (the
        very tensors sent)."""
        self._complete()
        sent, self._sent = self._sent, {}
        self._ready, self._started = {}, set()
        done = set()
        for index, (grad, variable) in enumerate(zip(grads, variables)):
            position = self._position_of.get(id(variable))
            if position is not None and grad is not None and sent.get(position) is grad:
                done.add(index)
        return done

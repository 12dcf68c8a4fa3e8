"""`DistributedOptimizer` under Keras's other backends (torch, jax).

Both trainers end in `optimizer.apply(grads)`: torch's after
`loss.backward()`, JAX's inside the jitted step (`stateless_apply` calls
`apply`). The distributed optimizer reduces the gradients there with the
backend's `grouped_allreduce`, one fused collective per dtype (or per
gradient group), before the user's optimizer unscales, clips, decays and
updates. As under TensorFlow the optimizer is converted in place into a
subclass of its own class that keeps its name, so saved files record the
plain optimizer.

`backward_passes_per_step` > 1 uses Keras's own gradient accumulation
(`gradient_accumulation_steps`, which works inside JAX's stateless step):
the passes are summed locally and the reduction moves to the update step,
in `_clip_gradients`, which Keras calls with the accumulated gradients just
before clipping. Under JAX every pass traces that call, so the reduction
sits in a `lax.cond` on the update step: the other passes move no bytes.
With sharded state hvdkeras sums the passes itself and hands each window to
the sharded step once: in plain tensors under torch (`pass_accumulation`),
in scratch optimizer variables and a `lax.cond` under JAX
(`jax/pass_window`).

What may import this module: `hvdkeras.training.optimizer` (which dispatches
to it under these backends).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Set

import importlib

import keras

from hvdkeras import compat
from hvdkeras.backends import sharded_optimizer
from hvdkeras.backends.gradient_reduction import reduce_gradients, reduction_scaling
from hvdkeras.backends.pass_accumulation import PassAccumulator
from hvdkeras.engine import buckets, config, frameworks, process_sets, world
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Adasum, Average, Sum
from hvdkeras.sharding.sharded_optimizer import AroundShardsMixin, shard_holder


class _TorchDistributedMixin(AroundShardsMixin):
    """Methods placed in front of the user's optimizer class."""

    _hvdkeras_settings: Dict[str, Any]
    _hvdkeras_local_ids: Set[int]

    def build(self, variables):
        super().build(variables)
        if self._hvdkeras_accumulator is not None:  # sharded: the holder is built now
            self._hvdkeras_accumulator.build(shard_holder(self))
        self._hvdkeras_hook_backward(list(variables))

    def _hvdkeras_hook_backward(self, variables: List[Any]) -> None:
        """Starts reducing during the backward pass where it applies (Note
        [reductions during the backward pass])."""
        if self._hvdkeras_backward_decided or not variables:
            return
        _untracked(self, "_hvdkeras_backward_decided", True)  # once, not every step
        # The settings first: asking where a sharded variable lives must not
        # gather it.
        if (frameworks.keras_backend() == frameworks.TORCH
                and _backward_overlap().eligible(self._hvdkeras_settings, enabled=True)
                and _overlap_wanted(variables)):
            settings = self._hvdkeras_settings
            scaling = reduction_scaling(settings, process_sets.view(settings["process_set"]).size)
            _untracked(self, "_hvdkeras_backward", _backward_overlap().BackwardReductions(
                variables, settings, scaling, self._hvdkeras_local_ids))

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        # Keras's JAX step calls this, not `apply`, and a LossScaleOptimizer's
        # own version never reaches `apply`: reduce here, before its finite
        # check, and let `apply` pass the reduced gradients on.
        if self._hvdkeras_settings["passes"] > 1:  # reduced on the update step
            return super().stateless_apply(optimizer_variables, grads, trainable_variables)
        with sharded_optimizer.step_scope(self):
            reduced = self._hvdkeras_reduce(list(grads), self._hvdkeras_variables())
            _untracked(self, "_hvdkeras_reduced", True)
            try:
                return super().stateless_apply(optimizer_variables, reduced, trainable_variables)
            finally:
                _untracked(self, "_hvdkeras_reduced", False)

    def _hvdkeras_variables(self) -> List[Any]:
        """The model's variables the optimizer was built for, in order."""
        holder = shard_holder(self)
        if holder is not None and holder.built:  # built on stand-ins
            return list(holder._hvdkeras_shards.variables)
        return list(getattr(self, "_trainable_variables", []))

    def _hvdkeras_reduce(self, grads: List[Any], variables: List[Any]) -> List[Any]:
        """The gradients to apply: averaged (or, with ZeRO stage 2, averaged
        for this rank's own variables only)."""
        holder = shard_holder(self)
        if holder is None or holder._hvdkeras_shards.stage < 2:
            return reduce_gradients(grads, variables, self._hvdkeras_settings,
                                    self._hvdkeras_local_ids)
        if holder._hvdkeras_shards.stage == 3:
            return sharded_optimizer.held_gradients(grads, variables, self._hvdkeras_settings,
                                                    self._hvdkeras_local_ids, holder,
                                                    loss_scaled=holder is not self)
        return sharded_optimizer.reduce_to_owners(grads, variables, self._hvdkeras_settings,
                                                  self._hvdkeras_local_ids, holder,
                                                  loss_scaled=holder is not self)

    def apply(self, grads, trainable_variables=None):
        if self._hvdkeras_accumulator is not None:
            return self._hvdkeras_apply_window(list(grads), trainable_variables)
        if self._hvdkeras_settings["passes"] > 1 or self._hvdkeras_reduced:
            return super().apply(grads, trainable_variables)
        with sharded_optimizer.step_scope(self):
            return self._hvdkeras_apply(list(grads), trainable_variables)

    def _hvdkeras_apply(self, grads: List[Any], trainable_variables: Optional[Sequence[Any]]):
        variables = list(trainable_variables) if trainable_variables is not None else \
            self._hvdkeras_variables()
        backward = self._hvdkeras_backward
        reduced = backward.finish(grads, variables) if backward is not None else set()
        rest = [None if k in reduced else g for k, g in enumerate(grads)]
        rest = self._hvdkeras_reduce(rest, variables)
        if self.built:  # built before it was distributed: hooked from the next step
            self._hvdkeras_hook_backward(list(getattr(self, "_trainable_variables", [])))
        return super().apply([grads[k] if k in reduced else g for k, g in enumerate(rest)],
                             trainable_variables)

    def _hvdkeras_apply_window(self, grads: List[Any],
                               trainable_variables: Optional[Sequence[Any]]):
        """Sharded state with `backward_passes_per_step` > 1: adds the pass to
        this rank's sums and, on a window's last pass, reduces and applies
        them as one step (the optimizer's iterations count updates, as with
        Keras's accumulation)."""
        variables = list(trainable_variables) if trainable_variables is not None else \
            self._hvdkeras_variables()

        def apply_total(summed: List[Any]) -> Any:
            with sharded_optimizer.step_scope(self):
                return self._hvdkeras_apply(summed, trainable_variables)

        return self._hvdkeras_accumulator.window(grads, variables, apply_total)

    def _backend_apply_gradients(self, grads, trainable_variables):
        # The variables of the gradients `_clip_gradients` will see (set past
        # Keras's attribute tracking: see _untracked).
        _untracked(self, "_hvdkeras_applying", list(trainable_variables))
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)
        finally:
            _untracked(self, "_hvdkeras_applying", None)

    def _clip_gradients(self, grads):
        if self._hvdkeras_settings["passes"] > 1 and self._hvdkeras_accumulator is None:
            grads = self._hvdkeras_reduce_accumulated(list(grads))
        return super()._clip_gradients(grads)

    def _hvdkeras_reduce_accumulated(self, grads: List[Any]) -> List[Any]:
        settings = self._hvdkeras_settings
        variables = self._hvdkeras_applying
        if variables is None or len(variables) != len(grads):
            raise RuntimeError("hvdkeras: gradients reached _clip_gradients outside apply(); "
                               "backward_passes_per_step needs Keras's own apply path.")
        # Keras hands over the mean of the passes; Horovod's default is their sum.
        scale = 1.0 if settings["average_aggregated"] else float(settings["passes"])

        def reduce(values):
            return reduce_gradients(list(values), variables, settings,
                                    self._hvdkeras_local_ids, scale=scale)

        if frameworks.keras_backend() != "jax":
            return reduce(grads)  # Keras's torch path calls this on update steps only
        import jax  # lazy: an optional extra, present when the backend is jax

        is_update = (self._iterations + 1) % settings["passes"] == 0
        return list(jax.lax.cond(is_update, reduce, list, grads))


def _untracked(optimizer: Any, name: str, value: Any) -> None:
    """Sets an attribute that Keras must not track: a list of the model's
    variables set normally would join `optimizer.variables` (under JAX the
    step then receives, and donates, those buffers twice)."""
    object.__setattr__(optimizer, name, value)


def _overlap_wanted(variables: List[Any]) -> bool:
    """`HVDKERAS_TORCH_BACKWARD_OVERLAP`; "auto" means when the ranks span several
    hosts (on one host the reduction is CPU work on the cores the backward pass
    uses, measured in docs/backends.md), or when the model is on GPUs
    (`buckets.overlap_wanted`). The same answer on every rank, as the requests'
    names depend on it."""
    w = world.require()
    # The storage, not `value`: a sharded variable's value is a gather.
    on_gpus = any(getattr(compat.variable_storage(v), "is_cuda", False) for v in variables)
    return buckets.overlap_wanted(w.local_size, w.size, mode=config.torch_backward_overlap(),
                                  on_gpus=on_gpus)


def _pass_window(passes: int, average: bool) -> Any:
    """Where sharded state sums its passes: plain tensors under torch's eager
    step; optimizer variables under JAX's jitted one."""
    if frameworks.keras_backend() != "jax":
        return PassAccumulator(passes, average)
    # Lazy: imports jax, present only under that backend.
    return importlib.import_module("hvdkeras.backends.jax.pass_window").TracedPassWindow(
        passes, average)


def _backward_overlap() -> Any:
    # Lazy: imports torch, present only under that backend.
    return importlib.import_module("hvdkeras.backends.torch.backward_overlap")


def _check_passes(optimizer: keras.optimizers.Optimizer, passes: int) -> None:
    """What accumulation needs of the optimizer (the arguments' types and ranges
    were checked by `hvdkeras.training.optimizer`, which dispatches here)."""
    if passes == 1:
        return
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise ValueError(
            f"backward_passes_per_step={passes} with a LossScaleOptimizer is not supported under "
            f"the {frameworks.keras_backend()} backend: Keras's LossScaleOptimizer hands its "
            "gradients to the inner optimizer, so the passes would not be accumulated. Give the "
            "inner optimizer gradient_accumulation_steps= and reduce every pass (leave "
            "backward_passes_per_step=1), or train without loss scaling.")
    if optimizer.gradient_accumulation_steps:
        raise ValueError(
            f"Optimizer {optimizer.name!r} already accumulates gradients "
            f"(gradient_accumulation_steps={optimizer.gradient_accumulation_steps}); set either "
            "that or DistributedOptimizer(backward_passes_per_step=...), not both.")
    if optimizer.built:
        raise ValueError(
            f"backward_passes_per_step={passes} needs an optimizer that is not built yet (its "
            f"gradient accumulators are made when it is built); wrap {optimizer.name!r} before "
            "compiling or training with it.")


def _with_loss_scaling(optimizer: keras.optimizers.Optimizer,
                       passes: int) -> keras.optimizers.Optimizer:
    """Under the "mixed_float16" policy, `optimizer` inside a
    LossScaleOptimizer that the distributed one will hold (Note [distributed
    wrapper outside loss scaling]): `compile()` would otherwise wrap the
    distributed optimizer, and its overflow check would see this rank's
    gradients alone."""
    lso_class = keras.optimizers.LossScaleOptimizer
    if keras.config.dtype_policy().name != "mixed_float16" or isinstance(optimizer, lso_class):
        return optimizer
    if passes > 1:
        raise ValueError(
            f"backward_passes_per_step={passes} under the 'mixed_float16' policy is not "
            f"supported under the {frameworks.keras_backend()} backend: the loss scaling "
            "that policy needs would hand its gradients to the inner optimizer before they "
            "are accumulated. Use 'mixed_bfloat16' (no loss scaling), or give the optimizer "
            "gradient_accumulation_steps= and leave backward_passes_per_step=1.")
    return lso_class(optimizer)


def is_distributed(optimizer: Any) -> bool:
    """Whether `optimizer` was returned by `hvdkeras.DistributedOptimizer`."""
    return isinstance(optimizer, _TorchDistributedMixin)


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer,
                         name: Optional[str] = None, compression: Any = None,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False,
                         gradient_predivide_factor: float = 1.0, op: int = Average,
                         num_groups: int = 0, groups: Optional[Sequence[Sequence[Any]]] = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True,
                         zero_stage: int = 0) -> keras.optimizers.Optimizer:
    """Makes a Keras 3 optimizer average gradients across all ranks (torch, jax).

    `hvdkeras.DistributedOptimizer` calls this under these backends, once it
    has checked what every backend shares (a Keras 3 optimizer, not yet
    distributed; the ZeRO stage); the arguments are its own.

    Args:
        optimizer: A Keras 3 optimizer.
        name: Prefix of the collective names (the same on every rank).
        compression: `hvdkeras.Compression.fp16` or `.bf16` to send gradients
            at half width.
        op: `hvdkeras.Average` (default), `hvdkeras.Sum`, or `hvdkeras.Adasum`
            (combines the ranks' gradients without dividing by their number).
        backward_passes_per_step: Sum the gradients of this many passes
            locally (Keras's `gradient_accumulation_steps`) and reduce once,
            on the pass that updates the weights.
        average_aggregated_gradients: With `backward_passes_per_step` > 1,
            apply the mean of the passes instead of their sum.
        gradient_predivide_factor: Average as a sum of gradients times 1/f
            before and f/size after the reduction.
        num_groups: Split the gradients into this many fused requests.
        groups: Explicit groups as lists of variables.
        process_set: Reduce over this set's ranks only.
        scale_local_gradients: Divide the gradients of `register_local_var`
            variables by the set's size.
        zero_stage: 1 keeps each variable's optimizer state on one rank (its
            owner updates it and the weights are gathered back); 2 also sends
            each owner only its own reduced gradients (a reduce-scatter); 3
            also shards the model's weights. As under
            TensorFlow (`docs/memory-scaling.md`). With
            `backward_passes_per_step` > 1 each rank sums its passes in
            full-size buffers of its own and reduces once per window.

    Returns:
        The distributed optimizer: the same object, converted in place, or
        under the "mixed_float16" policy a `LossScaleOptimizer` around it
        (made here, so that `compile()` keeps it and the overflow check
        sees the averaged gradients).

    Example:

    ```python
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(hvd.scale_lr(1e-3)))
    model.compile(optimizer=opt, loss="mse")
    ```
    """
    optimizer = _with_loss_scaling(optimizer, backward_passes_per_step)
    _check_passes(optimizer, backward_passes_per_step)
    if op not in (Average, Sum, Adasum):
        raise ValueError(f"DistributedOptimizer under the {frameworks.keras_backend()} backend "
                         f"takes op=hvdkeras.Average, Sum or Adasum, got {op!r}.")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor needs op=hvdkeras.Average.")
    process_sets.view(process_set)  # a clear error for an unregistered set
    accumulator = None
    if backward_passes_per_step > 1 and zero_stage:
        # Sharded state sums the passes here, not in Keras's accumulators.
        accumulator = _pass_window(backward_passes_per_step, average_aggregated_gradients)
    elif backward_passes_per_step > 1:
        optimizer.gradient_accumulation_steps = backward_passes_per_step
    name = name or f"{optimizer.name}_gradients"
    if zero_stage:
        sharded_optimizer.shard(optimizer, zero_stage, name, process_set)
    optimizer.__class__ = compat.with_mixin(_TorchDistributedMixin, type(optimizer))
    _untracked(optimizer, "_hvdkeras_settings", {
        "name": name, "compression": compression, "zero_stage": int(zero_stage),
        "op": op, "gradient_predivide_factor": float(gradient_predivide_factor),
        "num_groups": int(num_groups), "groups": None if groups is None else
        [list(g) for g in groups], "process_set": process_set,
        "scale_local_gradients": bool(scale_local_gradients),
        "passes": int(backward_passes_per_step),
        "average_aggregated": bool(average_aggregated_gradients)})
    _untracked(optimizer, "_hvdkeras_applying", None)
    _untracked(optimizer, "_hvdkeras_reduced", False)
    _untracked(optimizer, "_hvdkeras_backward", None)
    _untracked(optimizer, "_hvdkeras_backward_decided", False)
    _untracked(optimizer, "_hvdkeras_accumulator", accumulator)
    optimizer._hvdkeras_local_ids = set()
    if zero_stage == 3:
        sharded_optimizer.shard_parameters(optimizer, optimizer._hvdkeras_settings)
    return optimizer

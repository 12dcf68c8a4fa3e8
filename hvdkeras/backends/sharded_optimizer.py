"""Sharded optimizer state (`DistributedOptimizer(..., zero_stage=1|2)`)
under Keras's torch and JAX backends.

The sharded optimizer is the one `hvdkeras.sharding` defines for every
backend: the same owner plan, stand-ins, slot layout, global-norm clipping
and normal (unsharded) checkpoints. What differs here is how the step
moves tensors (`sharded_exchange`): stage 2's gradients reach their owners
by reduce-scatter, and the updated weights come back by one allgather per
dtype (JAX) or one broadcast per owner into the variables (torch). Keras's
JAX step calls `stateless_apply`, which Keras builds on the variables the
optimizer was built with, the stand-ins; here its mapping is built on the
model's own variables, so the weights other ranks own come back into the
step's result.

`backward_passes_per_step` > 1: every rank sums its passes in full-size
buffers of its own (`pass_accumulation` under torch, `jax/pass_window`
under JAX) and the window's total goes through the sharded step once.
Keras's own
`gradient_accumulation_steps` and `use_ema` work under both: their slots
follow the variables like every other slot.

What may import this module: `hvdkeras.backends.optimizer` and
`hvdkeras.backends.jax.pass_window`.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, ContextManager, Dict, List, Sequence, Set, Tuple

import keras

from hvdkeras import compat
from hvdkeras.backends import dispatch
from hvdkeras.backends.gradient_reduction import (gradient_groups, reduce_gradients,
                                                  reduction_scaling)
from hvdkeras.backends.sharded_exchange import reduce_scatter_to_owners, share_from_owners
from hvdkeras.engine import process_sets
from hvdkeras.engine.types import Min, Sum
from hvdkeras.sharding.sharded_optimizer import ShardedOptimizerMixin, shard_holder
from hvdkeras.sharding.state import ShardState


class BackendShardedMixin(ShardedOptimizerMixin):
    """The sharded optimizer's tensor work under torch and JAX (at stage 3
    with the model's weights sharded too: Note [sharded parameters under
    torch], Note [sharded parameters under JAX])."""

    def stateless_apply(self, optimizer_variables, grads, trainable_variables):
        state = self._hvdkeras_shards
        model_variables = state.variables
        if len(trainable_variables) != len(model_variables) \
                or len(optimizer_variables) != len(self.variables):
            raise ValueError(
                f"{type(self).__name__}.stateless_apply got {len(trainable_variables)} "
                f"trainable and {len(optimizer_variables)} optimizer values; it was built for "
                f"{len(model_variables)} and has {len(self.variables)}.")
        if self._hvdkeras_parameters is None:
            return run_stateless(model_variables, trainable_variables, self.variables,
                                 optimizer_variables, lambda: self.apply(grads))
        # Stage 3 (JAX): the step's values are the rows, which the holdings
        # stand for; a weight this rank holds no rows of keeps its (empty)
        # value (Note [sharded parameters under JAX]).
        parameters = self._hvdkeras_parameters
        sharded = set(parameters.sharded)
        kept = [p for p in range(len(model_variables))
                if p in parameters.holdings or p not in sharded]
        new, optimizer_values = run_stateless(
            [parameters.holdings.get(p, model_variables[p]) for p in kept],
            [trainable_variables[p] for p in kept], self.variables, optimizer_variables,
            lambda: self.apply(grads))
        values = list(trainable_variables)
        for p, value in zip(kept, new):
            values[p] = value
        return values, optimizer_values

    def _hvdkeras_step_without_variables(self) -> None:
        # Keras's torch optimizers cannot update an empty list; the one part
        # every rank must run is the global norm's collective.
        self._clip_gradients([])
        self._iterations.assign_add(1)

    def _hvdkeras_after_update(self) -> None:
        if self._hvdkeras_parameters is not None:
            # Stage 3: each rank keeps its rows; whole values gathered before
            # the update are stale now.
            self._hvdkeras_parameters.forget_gathered()
            return
        self._hvdkeras_share_weights()

    def _hvdkeras_share_weights(self) -> None:
        state = self._hvdkeras_shards
        if state.world_size == 1:
            return
        share_from_owners(state, f"{state.name}_weights")

    def _hvdkeras_sum_across(self, value: Any, name: str) -> Any:
        return dispatch.backend_function("grouped_allreduce")(
            [value], name=name, op=Sum, process_set=self._hvdkeras_shards.process_set)[0]


def run_stateless(model_variables: Sequence[Any], model_values: Sequence[Any],
                  optimizer_variables: Sequence[Any], optimizer_values: Sequence[Any],
                  step: Callable[[], Any]) -> Tuple[List[Any], List[Any]]:
    """Runs `step` with the variables reading the given values; returns the
    values they hold after it (model's, optimizer's), with nothing assigned
    to the variables themselves. Under JAX the values may be traced.

    Example:

    ```python
    new_model, new_optimizer = run_stateless(model_vars, model_values, opt.variables,
                                             opt_values, lambda: opt.apply(grads))
    ```
    """
    mapping = (list(zip(model_variables, model_values))
               + list(zip(optimizer_variables, optimizer_values)))
    with keras.StatelessScope(state_mapping=mapping) as scope:
        step()
    return ([scope.get_current_value(v) for v in model_variables],
            [scope.get_current_value(v) for v in optimizer_variables])


def shard(optimizer: Any, zero_stage: int, name: str, process_set: Any) -> None:
    """Puts the sharded class in front of the optimizer that holds the slots
    (the optimizer, or a LossScaleOptimizer's inner one)."""
    holder = getattr(optimizer, "inner_optimizer", optimizer)
    holder.__class__ = compat.with_mixin(BackendShardedMixin, type(holder))
    ps = process_sets.view(process_set)
    holder._hvdkeras_shards = ShardState(ps.set_rank, ps.size, f"{name}_zero", process_set,
                                         zero_stage, can_split=True)


# Each backend's stage-3 weights: (module, class).
_SHARDED_PARAMETERS = {
    "torch": ("hvdkeras.backends.torch.parameters", "TorchShardedParameters"),
    "jax": ("hvdkeras.backends.jax.parameters", "JaxShardedParameters"),
}


def shard_parameters(optimizer: Any, settings: Dict[str, Any]) -> None:
    """ZeRO stage 3: the model's weights are sharded when the optimizer is
    built (Note [sharded parameters under torch], Note [sharded parameters
    under JAX])."""
    holder = shard_holder(optimizer)
    module, name = _SHARDED_PARAMETERS[keras.backend.backend()]
    # Lazy: the backend's binding, present under that backend only.
    parameters = getattr(importlib.import_module(module), name)
    scaling = reduction_scaling(settings, holder._hvdkeras_shards.world_size)
    holder._hvdkeras_parameters = parameters(holder._hvdkeras_shards, settings, scaling)


def held_gradients(grads: Sequence[Any], variables: Sequence[Any], settings: Dict[str, Any],
                   local_ids: Set[int], holder: Any, loss_scaled: bool) -> List[Any]:
    """Stage 3's gradients: those the backward pass already reduced to their
    holders (Note [sharded parameters under torch], and under JAX every
    sharded one: Note [sharded parameters under JAX]) pass through, the rest
    (local variables; every gradient of a step that began before the
    weights were sharded) go stage 2's way. None where this rank holds no
    rows (or, under loss scaling, the flag of every rank's finiteness)."""
    state: ShardState = holder._hvdkeras_shards
    if not holder.built:
        holder.build(list(variables))
    arrived = holder._hvdkeras_parameters.take_arrived()
    positions = [state.position(v) for v in variables]
    grads = list(grads)
    result = reduce_to_owners([None if positions[i] in arrived else g
                               for i, g in enumerate(grads)],
                              variables, settings, local_ids, holder, loss_scaled=False)
    for i, p in enumerate(positions):
        if p in arrived and grads[i] is not None:
            result[i] = grads[i] if state.keeps(p) else None
    if loss_scaled:
        present = [i for i, g in enumerate(grads) if g is not None]
        flag = _finite_everywhere_flag([result[i] for i in present if result[i] is not None],
                                       state)
        result = [flag if i in present and result[i] is None else g
                  for i, g in enumerate(result)]
    return result


def step_scope(optimizer: Any) -> ContextManager[None]:
    """Where a sharded step traced under JAX must run its collectives in call
    order (Note [collectives in call order] in hvdkeras/backends/jax/ops.py):
    a rank's program depends on what it owns. Elsewhere nothing is needed."""
    if shard_holder(optimizer) is None or keras.backend.backend() != "jax":
        return contextlib.nullcontext()
    # Lazy: the JAX binding, present under that backend only.
    return importlib.import_module("hvdkeras.backends.jax.ops").collectives_in_call_order()


def reduce_to_owners(grads: Sequence[Any], variables: Sequence[Any], settings: Dict[str, Any],
                     local_ids: Set[int], holder: Any, loss_scaled: bool) -> List[Any]:
    """Stage 2's reduction: a list like `grads`, reduced where this rank owns
    the variable (or keeps it local), None elsewhere.

    Under loss scaling the positions a rank does not own carry one scalar
    instead: 0 when every rank's own gradients are finite, NaN otherwise,
    so the loss-scale optimizer takes the same decision on every rank.
    """
    state: ShardState = holder._hvdkeras_shards
    if not holder.built:
        holder.build(list(variables))
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    whole = [i for i in present if id(variables[i]) in local_ids]
    result = reduce_gradients([grads[i] if i in whole else None for i in range(len(grads))],
                              variables, settings, local_ids)
    split = [i for i in present if i not in set(whole)]
    op, prescale, postscale = reduction_scaling(settings, state.world_size)
    planned = gradient_groups(split, variables, settings)
    for number, group in enumerate(planned):
        by_position = {state.position(variables[i]): i for i in group}
        units, owner_of = state.units({p: grads[i] for p, i in by_position.items()})
        mine = reduce_scatter_to_owners(
            units, owner_of, state.rank, state.world_size,
            f"{settings['name']}_shards.{number}", op, prescale, postscale,
            settings["process_set"], settings["compression"])
        for (p, _), value in mine.items():
            result[by_position[p]] = value
    if loss_scaled:
        flag = _finite_everywhere_flag([result[i] for i in present if result[i] is not None],
                                       state)
        result = [flag if i in present and result[i] is None else g
                  for i, g in enumerate(result)]
    return result


def _finite_everywhere_flag(values: Sequence[Any], state: ShardState) -> Any:
    """0.0 when every rank's `values` are all finite, NaN otherwise."""
    finite = keras.ops.ones([1], "float32")
    for value in values:
        finite = finite * keras.ops.cast(keras.ops.all(keras.ops.isfinite(value)), "float32")
    everywhere = dispatch.backend_function("grouped_allreduce")(
        [finite], name=f"{state.name}_finite", op=Min, process_set=state.process_set)[0][0]
    return keras.ops.where(everywhere > 0, 0.0, float("nan"))

"""`DistributedOptimizer` under the TensorFlow backend: gradients averaged
across ranks at the top of `Optimizer.apply`.

Keras 3 funnels every update through `Optimizer.apply` (`apply_gradients`,
`model.fit`, `LossScaleOptimizer` and custom loops all call it), and `apply`
itself then unscales, clips, decays weights, updates and tracks the EMA. Reducing
there means all of these see the averaged gradients, exactly as one process
would on the global batch.

The optimizer is converted in place into a dynamically created subclass of its
own class that keeps the class's name and module: a `.keras` file records the
plain optimizer and loads without hvdkeras.

What may import this module: `hvdkeras.training.optimizer` (the public,
backend-neutral front), which loads it under TensorFlow only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence, Set

import keras
import tensorflow as tf

from hvdkeras import compat
from hvdkeras.collectives import xla_calls
from hvdkeras.collectives.common import fixed_collective_names
from hvdkeras.collectives.compression import Compressor
from hvdkeras.engine import config, process_sets, world
from hvdkeras.engine.types import Adasum, Average, Sum
from hvdkeras.engine.process_sets import ProcessSet
from hvdkeras.sharding.sharded_optimizer import AroundShardsMixin, shard_holder
from hvdkeras.sharding.state import ShardState
from hvdkeras.sharding.tf_parameters import ShardedParameterMixin, ShardedParameters, Reduction
from hvdkeras.sharding.tf_sharded_optimizer import TFShardedMixin
from hvdkeras.training import cross_step, cross_step_rules, guards
from hvdkeras.training.gradient_reduction import (ReductionSettings, reduce_gradients,
                                                 scale_factors)
from hvdkeras.training.local_accumulation import LocalGradientAccumulator
from hvdkeras.training.output import print_rank0
from hvdkeras.training.sharded_reduction import held_gradients, reduce_to_owners


_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum"}


class _DistributedOptimizerMixin(AroundShardsMixin):
    """Methods placed in front of the user's optimizer class."""

    _hvdkeras_reduction: ReductionSettings
    _hvdkeras_accumulator: Optional[LocalGradientAccumulator]
    _hvdkeras_local_ids: Set[int]

    def _hvdkeras_variables(self) -> list:
        """The variables the optimizer was built for."""
        holder = shard_holder(self)
        if holder is not None and holder.built:
            return list(holder._hvdkeras_shards.variables)
        return compat.optimizer_variables_built_for(self)

    def _hvdkeras_reduce(self, grads: list, variables: list) -> list:
        """The gradients to apply: averaged (or, with ZeRO stage 2, averaged
        for this rank's own variables only)."""
        holder = shard_holder(self)
        if holder is None or holder._hvdkeras_shards.stage < 2:
            return reduce_gradients(grads, self._hvdkeras_reduction, variables,
                                    self._hvdkeras_local_ids)
        if not holder.built:
            holder.build(variables)
        if holder._hvdkeras_shards.stage == 3:
            return held_gradients(grads, variables, self._hvdkeras_reduction,
                                  self._hvdkeras_local_ids, holder._hvdkeras_shards,
                                  loss_scaled=holder is not self)
        return reduce_to_owners(grads, variables, self._hvdkeras_reduction,
                                self._hvdkeras_local_ids, holder._hvdkeras_shards,
                                loss_scaled=holder is not self)

    def _var_key(self, variable):
        # Keras keys a variable by its tf.Variable, read through `value`,
        # which at stage 3 is the gathered weight (Note [sharded parameters]).
        if isinstance(variable, ShardedParameterMixin):
            return compat.variable_storage(variable)._unique_id
        return super()._var_key(variable)

    def build(self, variables):
        guards.check_not_inside_loss_scale_optimizer(self)
        super().build(variables)
        accumulator = self._hvdkeras_accumulator
        if accumulator is not None and not accumulator.built:
            accumulator.build(list(variables))
        self._hvdkeras_maybe_cross_step()

    def _hvdkeras_maybe_cross_step(self) -> None:
        """Turns on cross-step updates (Note [cross-step updates]) when the
        knob asks and this optimizer allows; says why not on rank 0."""
        mode = config.cross_step_overlap()
        w = world.require()
        if (not cross_step_rules.wanted(mode, w.local_size, w.size)
                or getattr(self, "_hvdkeras_cross_step", None) is not None):
            return
        reason = cross_step_rules.refusal(self._hvdkeras_cross_step_facts(mode))
        if reason is not None:
            if mode == "on":  # under auto, keeping the synchronous step is no surprise
                print_rank0(f"HVDKERAS_CROSS_STEP_OVERLAP is on, but {self.name} keeps "
                            f"the synchronous step: {reason}.")
            return
        cross_step.enable(self, self._hvdkeras_variables(), self._hvdkeras_reduction)

    def _hvdkeras_cross_step_facts(self, mode: str) -> cross_step_rules.StepFacts:
        settings = self._hvdkeras_reduction
        holder = shard_holder(self)
        keras_class = compat.class_without_mixins(self)
        plain = getattr(keras.optimizers, keras_class.__name__, None) is keras_class
        return cross_step_rules.StepFacts(
            mode=mode, optimizer_class=keras_class.__name__ if plain else "",
            loss_scaled=isinstance(self, keras.optimizers.LossScaleOptimizer),
            global_clipnorm=bool(getattr(self, "global_clipnorm", None)),
            ema=bool(getattr(self, "use_ema", False)),
            accumulation=(self._hvdkeras_accumulator is not None
                          or bool(getattr(self, "gradient_accumulation_steps", None))),
            zero_stage=0 if holder is None else holder._hvdkeras_shards.stage,
            reduce_op=_OP_NAMES.get(settings.op, str(settings.op)),
            explicit_groups=settings.groups is not None or bool(settings.num_groups),
            on_gpus=xla_calls.steps_on_gpu(), built_eagerly=tf.executing_eagerly())

    def apply(self, grads, trainable_variables=None):
        # A sharded step's graph differs per rank: its collectives are named
        # explicitly (Note [collective names]).
        naming = (fixed_collective_names() if shard_holder(self) is not None
                  else contextlib.nullcontext())
        with naming:
            return self._hvdkeras_apply(grads, trainable_variables)

    def _hvdkeras_apply(self, grads, trainable_variables):
        guards.check_not_inside_loss_scale_optimizer(self)
        grads = list(grads)
        if not grads:
            return super().apply(grads, trainable_variables)
        guards.check_not_in_xla()
        variables = None if trainable_variables is None else list(trainable_variables)
        if self._hvdkeras_accumulator is not None:
            return self._hvdkeras_apply_accumulated(grads, variables)
        pending = getattr(self, "_hvdkeras_cross_step", None)
        if pending is not None and pending.start(grads, variables):
            return None
        reduced = self._hvdkeras_reduce(grads, variables if variables is not None
                                        else self._hvdkeras_variables())
        return super().apply(reduced, variables)

    def _hvdkeras_apply_accumulated(self, grads, variables):
        if not self.built:
            if variables is None:
                raise ValueError(
                    "The optimizer is not built: pass trainable_variables to apply() or call "
                    "optimizer.build(model.trainable_variables) first."
                )
            self.build(variables)
        if variables is None:
            variables = self._hvdkeras_variables()
        accumulator = self._hvdkeras_accumulator
        if not accumulator.built:
            accumulator.build(self._hvdkeras_variables())
        positions = [accumulator.position(v) for v in variables]
        window_complete = accumulator.add(grads, positions)
        present = [k for k, g in enumerate(grads) if g is not None]
        base_apply = super().apply
        reduce = self._hvdkeras_reduce

        def update():
            summed = accumulator.values([positions[k] for k in present])
            full = [None] * len(grads)
            for k, value in zip(present, summed):
                full[k] = value
            base_apply(reduce(full, variables), variables)
            accumulator.reset([positions[k] for k in present])
            return None

        tf.cond(window_complete, update, lambda: None)


def is_distributed(optimizer: Any) -> bool:
    """Whether `optimizer` was made distributed here."""
    return isinstance(optimizer, _DistributedOptimizerMixin)


def _shard(optimizer: Any, zero_stage: int, settings: ReductionSettings) -> None:
    """Puts the sharded-state class in front of the optimizer holding the slots."""
    holder = getattr(optimizer, "inner_optimizer", optimizer)
    ps = process_sets.view(settings.process_set)
    holder.__class__ = compat.with_mixin(TFShardedMixin, type(holder))
    holder._hvdkeras_shards = ShardState(ps.set_rank, ps.size, f"{settings.name}_zero",
                                         settings.process_set, zero_stage, can_split=True)
    if zero_stage == 3:
        wire_op, prescale, postscale = scale_factors(settings.op,
                                                     settings.gradient_predivide_factor, ps.size)
        holder._hvdkeras_parameters = ShardedParameters(
            holder._hvdkeras_shards,
            Reduction(wire_op, prescale, postscale, settings.compression.compress,
                      settings.compression.decompress, settings.sparse_as_dense))


def DistributedOptimizer(optimizer: Any, name: Optional[str], compression: Compressor,
                         sparse_as_dense: bool, backward_passes_per_step: int,
                         average_aggregated_gradients: bool, gradient_predivide_factor: float,
                         op: int, num_groups: int, groups: Optional[Sequence[Sequence[Any]]],
                         process_set: ProcessSet, scale_local_gradients: bool,
                         zero_stage: int) -> keras.optimizers.Optimizer:
    """`hvdkeras.DistributedOptimizer` under TensorFlow: the arguments as there
    (checked, and the optimizer a Keras 3 one that is not yet distributed)."""
    lso_class = keras.optimizers.LossScaleOptimizer
    if isinstance(optimizer, lso_class) and is_distributed(optimizer.inner_optimizer):
        raise ValueError(guards.NESTING_MESSAGE)
    settings = ReductionSettings(
        op=op, compression=compression, sparse_as_dense=bool(sparse_as_dense),
        gradient_predivide_factor=float(gradient_predivide_factor), num_groups=num_groups,
        groups=None if groups is None else tuple(tuple(g) for g in groups),
        name=name or f"{optimizer.name}_gradients", process_set=process_set,
        scale_local_gradients=bool(scale_local_gradients),
    )
    if keras.config.dtype_policy().name == "mixed_float16" and not isinstance(optimizer, lso_class):
        optimizer = lso_class(optimizer)
    accumulator = None
    if backward_passes_per_step > 1:
        accumulator = LocalGradientAccumulator(backward_passes_per_step,
                                               average_aggregated_gradients)
        if optimizer.built:
            accumulator.build(compat.optimizer_variables_built_for(optimizer))
    if zero_stage:
        _shard(optimizer, zero_stage, settings)
    optimizer.__class__ = compat.with_mixin(_DistributedOptimizerMixin, type(optimizer))
    optimizer._hvdkeras_reduction = settings
    optimizer._hvdkeras_accumulator = accumulator
    optimizer._hvdkeras_local_ids = set()
    return optimizer

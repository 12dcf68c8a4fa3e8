"""ZeRO stage 2's gradient step: each rank receives the reduced gradients of
its own variables only (one reduce-scatter per dtype), instead of all of them.

Gradients every rank needs stay on the usual path (`reduce_gradients`): those
of local variables (not reduced) and sparse `tf.IndexedSlices` (gathered, so
that repeated rows are handled as on one process). Under loss scaling the
positions a rank does not own carry one scalar instead: 0 when every rank's
own gradients are finite, NaN otherwise, so the loss-scale optimizer takes
the same skip-or-apply decision on every rank (Note [distributed wrapper
outside loss scaling]).

What may import this module: the rest of `hvdkeras.training`.
"""

from __future__ import annotations

from typing import AbstractSet, List, Sequence

import tensorflow as tf

from hvdkeras import compat
from hvdkeras.collectives.kernels import in_xla
from hvdkeras.collectives.reduction import grouped_allreduce
from hvdkeras.engine import process_sets
from hvdkeras.engine.types import Min
from hvdkeras.sharding.exchange import reduce_scatter_to_owners
from hvdkeras.sharding.plan import REPLICATED
from hvdkeras.sharding.tf_sharded_optimizer import BUILD_FIRST_MESSAGE
from hvdkeras.sharding.state import ShardState
from hvdkeras.training.gradient_reduction import (ReductionSettings, plan_groups, positions_of,
                                                 reduce_gradients, scale_factors)


def _stays_whole(gradient, variable, settings: ReductionSettings,
                 local_ids: AbstractSet[int]) -> bool:
    if id(variable) in local_ids:
        return True
    return (isinstance(gradient, tf.IndexedSlices) and not settings.sparse_as_dense
            and not in_xla())


def _finite_everywhere_flag(values: Sequence[tf.Tensor], state: ShardState) -> tf.Tensor:
    """0.0 when every rank's `values` are all finite, NaN otherwise."""
    checks = [tf.reduce_all(tf.math.is_finite(v)) for v in values]
    local = tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
    everywhere = grouped_allreduce([tf.reshape(tf.cast(local, tf.float32), [1])],
                                   name=f"{state.name}_finite", op=Min,
                                   process_set=state.process_set)[0][0]
    return tf.where(everywhere > 0, tf.constant(0.0), tf.constant(float("nan")))


def reduce_to_owners(gradients: Sequence, variables: Sequence, settings: ReductionSettings,
                     local_ids: AbstractSet[int], state: ShardState,
                     loss_scaled: bool) -> List:
    """Stage 2 reduction: a list like `gradients`, reduced where this rank
    owns the variable (or every rank needs it), None (or the loss-scale
    flag) elsewhere."""
    gradients = list(gradients)
    present = [i for i, g in enumerate(gradients) if g is not None]
    whole = [i for i in present if _stays_whole(gradients[i], variables[i], settings, local_ids)]
    result = reduce_gradients([g if i in whole else None for i, g in enumerate(gradients)],
                              settings, variables, local_ids)
    split = [i for i in present if i not in set(whole)]
    ps = process_sets.view(settings.process_set)
    wire_op, prescale, postscale = scale_factors(settings.op, settings.gradient_predivide_factor,
                                                 ps.size)
    explicit = (None if settings.groups is None
                else positions_of(settings.groups, list(variables)))
    planned = plan_groups(split, settings.num_groups, explicit)
    for number, group in enumerate(planned):  # groups as in stage 0: see num_groups
        packed = {}
        for i in group:
            dense = tf.convert_to_tensor(gradients[i])
            packed[state.position(variables[i])] = (i, settings.compression.compress(dense))
        name = f"{settings.name}_shards" + ("" if len(planned) == 1 else f"_{number}")
        units, owner_of = state.units({p: c[0] for p, (_, c) in packed.items()})
        mine = reduce_scatter_to_owners(units, owner_of, state.rank, state.world_size, name,
                                        wire_op, prescale, postscale, settings.process_set)
        for (p, _), reduced in mine.items():
            i, (_, context) = packed[p]
            result[i] = settings.compression.decompress(reduced, context)
    if loss_scaled:
        for i in whole:
            if not state.keeps(state.position(variables[i])):
                result[i] = None  # a sparse gradient another rank applies
        flag = _finite_everywhere_flag(
            [r.values if isinstance(r, tf.IndexedSlices) else r
             for r in (result[i] for i in present) if r is not None], state)
        for i in present:
            if result[i] is None:
                result[i] = flag
    return result


def held_gradients(gradients: Sequence, variables: Sequence, settings: ReductionSettings,
                   local_ids: AbstractSet[int], state: ShardState, loss_scaled: bool) -> List:
    """Stage 3: the tape already returned each sharded weight's gradient
    reduced to the rows this rank holds (Note [sharded parameters]), so only
    local variables' gradients go the usual way; positions this rank holds
    no rows of become None (or the loss-scale flag)."""
    gradients = list(gradients)
    local = [g if state.owners[state.position(v)] == REPLICATED else None
             for g, v in zip(gradients, variables)]
    result = reduce_gradients(local, settings, variables, local_ids)
    held = []
    for i, (g, v) in enumerate(zip(gradients, variables)):
        p = state.position(v)
        if g is not None and state.owners[p] != REPLICATED and g.shape == v.shape \
                and tuple(g.shape) != tuple(compat.variable_storage(v).shape):
            raise ValueError(f"The gradient of {v.path!r} is whole: it was computed before "
                             f"zero_stage=3 sharded the weights. {BUILD_FIRST_MESSAGE}")
        if state.owners[p] != REPLICATED:
            result[i] = g if state.keeps(p) else None
        if result[i] is not None:
            held.append(i)
    if loss_scaled:
        flag = _finite_everywhere_flag(
            [r.values if isinstance(r, tf.IndexedSlices) else r
             for r in (result[i] for i in held)], state)
        for i, g in enumerate(gradients):
            if g is not None and result[i] is None:
                result[i] = flag
    return result

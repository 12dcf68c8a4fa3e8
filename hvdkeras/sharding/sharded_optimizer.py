"""The sharded optimizer: a Keras optimizer that keeps state for its own
variables only (ZeRO stages 1 to 3), updates them and shares the results
(at stage 3 the weights stay sharded instead: `tf_parameters`).

The class is placed in front of the optimizer that holds the slots (the
user's optimizer, or a LossScaleOptimizer's inner one) by
`hvdkeras.DistributedOptimizer(..., zero_stage=1|2)`; the gradient reduction
in front of it stays in `training/tf_optimizer.py` (TensorFlow, whose
subclass in `tf_sharded_optimizer.py` moves its tensors) or
`backends/optimizer.py` (torch, JAX, whose subclass in
`backends/sharded_optimizer.py` moves theirs). This module loads no
framework. `apply` receives a list like the variables: reduced gradients for
this rank's variables; for the others reduced gradients (stage 1), None (stage 2) or a scalar that carries
the loss-scale decision (stage 2 under loss scaling), which it ignores.
What a rank owns: Note [whole-variable shards] in `plan`.

What may import this module: `hvdkeras.sharding`, `hvdkeras.training` and
`hvdkeras.backends`.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import keras
import numpy as np

from hvdkeras.sharding.plan import REPLICATED
from hvdkeras.sharding.state import ShardState, slot_layout


class ShardedOptimizerMixin:
    """Methods placed in front of the slot-holding optimizer's class, for every
    backend; each backend's subclass moves the tensors (TensorFlow's in
    `tf_sharded_optimizer`, torch's and JAX's in `hvdkeras/backends`)."""

    _hvdkeras_shards: ShardState
    # At stage 3 the model's weights, sharded too (a backend's `ShardedWeights`).
    _hvdkeras_parameters: Any = None

    def build(self, variables):
        state = self._hvdkeras_shards
        if self.built:
            return
        # Other ranks' variables are stand-ins (Note [stand-ins keep the layout]).
        built_for = self._hvdkeras_before_build(
            state.plan(list(variables), elementwise=updates_elementwise(self)))
        super().build(built_for)
        state.layout = slot_layout(self, built_for)
        state.check_layout(self)
        self._hvdkeras_after_build()

    def _hvdkeras_before_build(self, built_for: List[Any]) -> List[Any]:
        """The list to build the slots on (at stage 3 with the rows this rank
        holds of the weights in place of the model's variables)."""
        if self._hvdkeras_parameters is None:
            return built_for
        return self._hvdkeras_parameters.make_holdings(built_for)

    def _hvdkeras_after_build(self) -> None:
        """Runs once the slots exist: at stage 3 the model's variables start
        reading their weights whole from the rows the ranks hold."""
        if self._hvdkeras_parameters is not None:
            self._hvdkeras_parameters.take_over()

    def apply(self, grads, trainable_variables=None):
        state = self._hvdkeras_shards
        grads = list(grads)
        variables = state.variables if trainable_variables is None else list(trainable_variables)
        if not self.built:
            self.build(variables)
        own_grads, own_vars, replicated = [], [], []
        for gradient, variable in zip(grads, variables):
            p = state.position(variable)
            if state.keeps(p) and gradient is not None:
                gradient, variable = self._hvdkeras_held(p, gradient, variable)
                own_grads.append(gradient)
                own_vars.append(variable)
                replicated.append(state.owners[p] == REPLICATED)
        state.applying_replicated = replicated
        if own_grads:
            super().apply(own_grads, own_vars)
        else:
            self._hvdkeras_step_without_variables()
        self._hvdkeras_after_update()

    def _hvdkeras_held(self, p: int, gradient: Any, variable: Any):
        """The gradient and the variable the update of position `p` uses."""
        if self._hvdkeras_parameters is not None:
            # Stage 3: the gradient arrives as the rows held; a local variable
            # (every rank keeps it whole) has no holding.
            holding = self._hvdkeras_parameters.holdings.get(p)
            if holding is not None:
                return gradient, holding
        if p in self._hvdkeras_shards.piece_variables:
            return self._hvdkeras_piece_step(p, gradient, variable)
        return gradient, variable

    def _hvdkeras_piece_step(self, p: int, gradient: Any, variable: Any):
        """This rank's piece of split variable `p` for the update: its rows
        of the gradient (stage 1 reduces whole gradients; stage 2's arrive
        cut) and the piece variable, first given the variable's current rows
        (the model's weights may have been set since the last step)."""
        state = self._hvdkeras_shards
        piece = state.piece_of(p, state.rank)
        part = state.piece_variables[p]
        part.assign(variable[piece.begin:piece.end])
        if tuple(gradient.shape) != tuple(part.shape):
            gradient = self._hvdkeras_rows(gradient, piece.begin, piece.end)
        return gradient, part

    def _hvdkeras_rows(self, gradient: Any, begin: int, end: int) -> Any:
        """Rows [begin, end) of a gradient (a backend with sparse gradients
        cuts those its own way)."""
        return gradient[begin:end]

    def _hvdkeras_after_update(self) -> None:
        """Shares the updated weights (on update steps, when Keras accumulates)."""
        raise NotImplementedError("each backend's sharded class moves its own tensors")

    def _hvdkeras_step_without_variables(self) -> None:
        """What `apply` does on a rank that owns none of the gradients: the
        parts every rank must run (shared counters, the global norm)."""
        with keras.name_scope(self.name, caller=self):
            self._backend_apply_gradients([], [])
        self._iterations.assign_add(1)

    def _hvdkeras_share_weights(self) -> None:
        """Gives every rank the values of the variables other ranks own."""
        raise NotImplementedError("each backend's sharded class moves its own tensors")

    def _clip_gradients(self, grads):
        state = self._hvdkeras_shards
        if not (self.global_clipnorm and self.global_clipnorm > 0) or state.world_size == 1:
            return super()._clip_gradients(grads)
        # The norm of every rank's gradients together: owners' partial sums
        # of squares, summed across ranks, plus this rank's local ones.
        flags = state.applying_replicated
        squares = [(keras.ops.sum(keras.ops.square(keras.ops.cast(g, "float32"))), is_local)
                   for g, is_local in zip(grads, flags) if g is not None]
        partial = keras.ops.zeros([1], "float32")
        for value, is_local in squares:
            if not is_local:
                partial = partial + value
        total = self._hvdkeras_sum_across(partial, f"{state.name}_global_norm")[0]
        for value, is_local in squares:
            if is_local:
                total = total + value
        norm = keras.ops.sqrt(total)
        clip = keras.ops.cast(self.global_clipnorm, "float32")
        # Keras's clip_by_global_norm: NaN for a non-finite norm.
        scale = clip * keras.ops.minimum(1.0 / norm, 1.0 / clip) + (norm - norm)
        return [None if g is None else g * keras.ops.cast(scale, g.dtype) for g in grads]

    def _hvdkeras_sum_across(self, value: Any, name: str) -> Any:
        """`value` summed over the ranks that share the state."""
        raise NotImplementedError("each backend's sharded class moves its own tensors")

    def finalize_variable_values(self, var_list):
        if self.use_ema:
            self._overwrite_model_variables_with_average_value(self._trainable_variables)
            self._hvdkeras_share_weights()

    def save_own_variables(self, store):
        save_sharded(self, self.variables, store)

    def load_own_variables(self, store):
        if not load_sharded(self, self.variables, store):
            super().load_own_variables(store)


# Keras's optimizers whose update of each element depends on that element
# alone (its gradient, its slots, shared scalars): a block of rows updated
# as a variable of its own gets what the whole variable gets. Lamb (the
# trust ratio's norms), Adafactor (factored moments), Muon (orthogonalised
# step) and ScheduleFreeAdamW are left out, as are subclasses (which may
# change `update_step`).
ELEMENTWISE_OPTIMIZERS = ("Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "Ftrl", "Lion",
                          "Nadam", "RMSprop", "SGD")


def updates_elementwise(optimizer: Any) -> bool:
    """Whether `optimizer` (sharded or not) updates each element on its own,
    so its variables may be cut into row blocks (Note [split variables] in
    `split_plan`): one of `ELEMENTWISE_OPTIMIZERS` itself, without
    `clipnorm` (a per-variable norm) or weight-decay exclusions made by
    variable object."""
    base = next(c for c in type(optimizer).__mro__
                if not issubclass(c, ShardedOptimizerMixin)
                and not c.__module__.startswith("hvdkeras."))
    plain = {getattr(keras.optimizers, n, None) for n in ELEMENTWISE_OPTIMIZERS}
    # Under torch Keras makes its own backend's class of some (TorchAdam ...).
    keras_own = base in plain or (base.__module__.startswith("keras.src.backend.")
                                  and any(b in plain for b in base.__bases__))
    return (keras_own and not getattr(optimizer, "clipnorm", None)
            and not getattr(optimizer, "_exclude_from_weight_decay", None))


def _where(holder: Any) -> Dict[int, int]:
    """id of each of the holder's variables -> its index in `holder.variables`."""
    return {id(v): i for i, v in enumerate(holder.variables)}


def _saved(holder: Any, variables: List[Any], where: Dict[int, int]) -> List[Any]:
    """`variables` less the holder's scratch (Note [scratch variables are not
    state] in `state`); `where` is `_where(holder)`."""
    state = holder._hvdkeras_shards
    return [v for v in variables
            if where.get(id(v)) is None or not state.is_scratch(where[id(v)])]


def save_sharded(holder: Any, variables: List[Any], store: Any) -> None:
    """Writes `variables` (the holder's, or a loss-scale optimizer's list that
    contains them) in the unsharded layout: other ranks' slots from the
    values gathered for this save."""
    state = holder._hvdkeras_shards
    where = _where(holder)
    for k, variable in enumerate(_saved(holder, variables, where)):
        i = where.get(id(variable))
        if i is None or state.is_everywhere(i) or state.is_own_slot(i):
            store[str(k)] = variable.numpy()
        elif state.gathered is not None and i in state.gathered:
            store[str(k)] = state.gathered[i]
        else:
            raise RuntimeError(
                f"This {type(holder).__name__} keeps its state sharded across "
                f"{state.world_size} ranks (zero_stage={state.stage}), so this rank alone "
                "cannot save it. Save through hvdkeras on every rank: "
                "hvdkeras.callbacks.CheckpointCallback, or "
                "`with hvdkeras.gathered_optimizer_state(model):` around the rank-0 "
                "save (every rank enters the block).")


def load_sharded(holder: Any, variables: List[Any], store: Any) -> bool:
    """Reads an unsharded layout into `variables`, keeping this rank's slots
    (and, on a rank collecting for `scatter_from_root`, the others' values).
    Returns False, loading nothing, when the counts differ (Keras then warns)."""
    where = _where(holder)
    variables = _saved(holder, variables, where)
    if len(store.keys()) != len(variables):
        return False
    state = holder._hvdkeras_shards
    for k, variable in enumerate(variables):
        value = store[str(k)]
        i = where.get(id(variable))
        if i is None or state.is_everywhere(i) or state.is_own_slot(i):
            variable.assign(value)
            continue
        if state.is_piece_slot(i):
            piece = state.piece_of(state.layout[i], state.rank)
            if piece is not None:
                variable.assign(np.asarray(value)[piece.begin:piece.end])
        if state.collecting:
            if state.pending is None:
                state.pending = {}
            state.pending[i] = np.asarray(value)
    return True


def is_sharded_parameter(variable: Any) -> bool:
    """Whether `variable` is a model weight sharded at `zero_stage=3`: it is
    the same on every rank by construction (one copy of each row, taken from
    rank 0 when sharded), so broadcasts leave it out."""
    return getattr(variable, "_hvdkeras_parameters", None) is not None


def shard_holder(optimizer: Any) -> Optional[Any]:
    """The sharded optimizer inside `optimizer` (itself or a loss-scale
    optimizer's inner one), or None."""
    for candidate in (optimizer, getattr(optimizer, "inner_optimizer", None)):
        if isinstance(candidate, ShardedOptimizerMixin):
            return candidate
    return None


def everywhere_variables(optimizer: Any) -> List[Any]:
    """`optimizer.variables` that have the same shape on every rank: all of
    them unless the state is sharded (then the shared and replicated ones)."""
    holder = shard_holder(optimizer)
    variables = list(getattr(optimizer, "variables", []) or [])
    if holder is None or not holder.built:
        return variables
    state = holder._hvdkeras_shards
    sharded = {id(v) for i, v in enumerate(holder.variables) if not state.is_everywhere(i)}
    return [v for v in variables if id(v) not in sharded]


class AroundShardsMixin:
    """Methods of a distributed optimizer whose slots may be sharded in itself
    or in the inner optimizer of a LossScaleOptimizer it wraps (every backend)."""

    _hvdkeras_local_ids: set

    def register_local_var(self, var) -> None:
        """Keeps `var`'s gradient local: it is not reduced across ranks
        (and is divided by the process set's size when the optimizer was
        made with `scale_local_gradients=True`, as in Horovod)."""
        self._hvdkeras_local_ids.add(id(var))
        holder = shard_holder(self)
        if holder is not None:  # every rank keeps its own state for it
            holder._hvdkeras_shards.replicated_ids.add(id(var))

    def save_own_variables(self, store):
        holder = shard_holder(self)
        if holder is None or holder is self or not holder.built:
            return super().save_own_variables(store)
        save_sharded(holder, self.variables, store)  # a loss-scale optimizer around the shards

    def load_own_variables(self, store):
        holder = shard_holder(self)
        if holder is None or holder is self or not holder.built \
                or not load_sharded(holder, self.variables, store):
            super().load_own_variables(store)


"""ZeRO stage 3 under Keras's JAX backend: the model's trainable weights
kept sharded between steps, gathered whole inside the jitted step, their
gradients reduce-scattered to the ranks that hold them.

Note [sharded parameters under JAX]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The plan is TensorFlow's and torch's (Note [sharded parameters] in
`hvdkeras/sharding/tf_parameters.py`): the same gather groups, owners and
row blocks. Keras's JAX trainer is stateless: each step receives the
variables' values as arrays and returns new ones, so the weights' rows
travel through the step as the state and nothing whole outlives it.

- Storage. A sharded model variable's `_value` is the array of this
  rank's rows (no rows: a zero-row array). The optimizer is built on plain
  variables of the rows' shape ("holdings") that read and write that same
  array.
- The step's state. While the trainer collects the step's state
  (`_get_jax_state`) a sharded variable answers with its rows; when the
  trainer writes the state back (`jax_state_sync`) it assigns rows, which
  the variable keeps as they are (a whole value assigned is cut to this
  rank's rows instead). `hvdkeras.backends.jax.trainer_hooks` wraps those
  trainer methods, the ones that run the model and the step methods (a
  model class's own overrides too).
- The forward pass. `compute_loss_and_updates` (training and evaluation)
  and a model's `stateless_call` inside a step first make the rows whole:
  each gather group's rows are packed per dtype into a block padded to
  the longest rank's, so every rank's block has the same shape (what an
  allgather inside `jit` needs), one allgather per block, each rank's
  part cut out in rank order. This runs in one `custom_vjp` function
  whose backward pass is stage 2's reduce-scatter of the whole gradients
  to their holders (the same units and summation order, so the weights
  are stage 0's bit for bit).
- Order. The ranks' programs differ in the update (what each holds), and
  XLA orders independent collectives by data dependencies (Note
  [collectives in call order] in `ops.py`). So the gathers run as one
  chain, the reduce-scatters as a chain that starts after the last
  gather, and the optimizer's collectives after the last reduce-scatter.
- Memory. Every group is gathered once per step, when the step begins, and
  XLA keeps the whole weights the backward pass needs until it has used
  them: between steps a rank holds its rows, its slots and nothing whole,
  but the step's peak holds every weight whole (torch frees each group
  after the forward pass and gathers it again for the backward pass).
- Reads outside the step (`get_weights`, a save, evaluation's shape
  inference) gather a variable's group eagerly, as under torch: the first
  read of a group's member gathers the group, its other members wait for
  their own first read, and an assignment drops what waits.

What may import this module: `hvdkeras.backends.sharded_optimizer` (lazily,
under the JAX backend).
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import jax
import jax.numpy as jnp
import keras
import numpy as np

from hvdkeras import compat
from hvdkeras.backends.jax import ops, trainer_hooks
from hvdkeras.backends.sharded_exchange import reduce_scatter_to_owners
from hvdkeras.engine import process_sets
from hvdkeras.sharding.parameters import ShardedWeights
from hvdkeras.sharding.plan import by_dtype
from hvdkeras.sharding.state import ShardState, answering_to


class _Part(NamedTuple):
    """One dtype's block of a gather group."""

    tag: str                  # the block's name suffix: group and dtype number
    members: List[int]        # positions, in group order
    counts: List[List[int]]   # counts[rank][k]: elements of members[k] that rank holds
    padded: int               # the longest rank's total
    dtype: str


class JaxShardedParameters(ShardedWeights):
    """The rows of the model's weights this rank holds under JAX, and how to
    make them whole (Note [sharded parameters under JAX]).

    Args:
        state: The optimizer's shard (its plan is the weights' too).
        settings: The distributed optimizer's settings (its reduction: op,
            scale factors, compression).
        scaling: (op on the wire, prescale, postscale) of the reduction.
    """

    def __init__(self, state: ShardState, settings: Dict[str, Any],
                 scaling: Tuple[int, float, float]) -> None:
        super().__init__(state)
        self.settings = settings
        self.scaling = scaling
        self.waiting: Dict[int, jax.Array] = {}
        # The last reduce-scatter of a traced backward pass, which the
        # optimizer's collectives of the same step must follow.
        self.after_backward: Optional[Any] = None
        self._gather_step = _differentiable_gather(self)

    # -- taking the weights over ------------------------------------------

    def _take_rows(self, number: int, group: Sequence[int]) -> List[Optional[keras.Variable]]:
        """Rank 0's values of the group (one broadcast per dtype), each model
        variable's `_value` cut to this rank's rows; the holdings are
        variables that read and write those rows."""
        state = self.state
        values = [jnp.asarray(compat.variable_storage(state.variables[p])) for p in group]
        if state.world_size > 1:  # the weights start as rank 0's
            values = self._broadcast(values, f"{state.name}_take_over_{number}", 0)
        holdings: List[Optional[keras.Variable]] = []
        for p, whole in zip(group, values):
            variable = state.variables[p]
            rows = self._my_rows(variable, whole)
            compat.replace_variable_storage(variable, jnp.array(rows))  # its own copy
            begin, end = state.held_rows(p, state.rank)
            if end <= begin:
                holdings.append(None)
                continue
            holding = answering_to(variable, keras.Variable(
                np.zeros(rows.shape, rows.dtype), trainable=True,
                name=str(variable.name).split(":")[0]))
            holding.__class__ = compat.with_mixin(JaxHoldingMixin, type(holding))
            holding._hvdkeras_rows_of = variable
            compat.replace_variable_storage(holding, None)  # the rows live in `variable`
            holdings.append(holding)
        return holdings

    def take_over(self) -> None:
        """Gives each sharded model variable the class that reads it whole,
        and has Keras's JAX trainer carry rows (`trainer_hooks`)."""
        trainer_hooks.install()
        for p in self.sharded:
            variable = self.state.variables[p]
            variable.__class__ = compat.with_mixin(JaxShardedParameterMixin, type(variable))
            variable._hvdkeras_parameters = self

    # -- the step's gathers -----------------------------------------------

    def whole_for_step(self, rows: Dict[int, Any]) -> Dict[int, Any]:
        """Whole values of the positions in `rows` (this rank's rows of each,
        as the step's state carries them, traced), through the gather whose
        gradient is the reduce-scatter to the holders."""
        groups = [[p for p in group if p in rows] for group in self.state.groups]
        layout = [(number, self._parts(number, members))
                  for number, members in enumerate(groups) if members]
        blocks = [self._block(part, rows) for _, parts in layout for part in parts]
        wholes = self._gather_step(layout, blocks)
        return dict(zip([p for _, parts in layout for part in parts for p in part.members],
                        wholes))

    def gather_blocks(self, layout: Sequence[Tuple[int, List[_Part]]],
                      blocks: Sequence[Any], what: str) -> Tuple[List[Any], Optional[Any]]:
        """Every member's whole value from the ranks' padded blocks, in the
        order of `layout`; and the last allgather's output (None without
        one). One chain of collectives (Note [sharded parameters under JAX])."""
        state = self.state
        set_id = process_sets.view(state.process_set).set_id
        wholes: List[Any] = []
        block = iter(blocks)
        with ops.call_order_after(None):
            for _, parts in layout:
                for part in parts:
                    mine = next(block)
                    everyone = ops.allgather(mine, f"{state.name}_{what}_{part.tag}", set_id) \
                        if part.padded else mine
                    wholes.extend(self._cut(part, everyone))
            last = ops.last_in_order()
        return wholes, last

    def reduce_blocks(self, layout: Sequence[Tuple[int, List[_Part]]],
                      cotangents: Sequence[Any], after: Optional[Any]) -> List[Any]:
        """Each block's gradient: this rank's rows of the whole gradients,
        reduced across ranks with stage 2's units and order, padded as the
        block was. A chain that starts after `after`."""
        state = self.state
        op, prescale, postscale = self.scaling
        grads: List[Any] = []
        flat = iter(cotangents)
        with ops.call_order_after(after):
            for number, parts in layout:
                upstream = {p: next(flat) for part in parts for p in part.members}
                units, owner_of = state.units({p: _as_rows(g) for p, g in upstream.items()})
                mine = reduce_scatter_to_owners(units, owner_of, state.rank, state.world_size,
                                                f"{state.name}_param_grads_{number}", op,
                                                prescale, postscale, state.process_set,
                                                self.settings["compression"])
                for part in parts:
                    grads.append(self._block_of_grads(part, mine))
            self.after_backward = ops.last_in_order()
        return grads

    def take_arrived(self) -> Set[int]:
        """The positions whose gradients the step's backward pass reduced to
        their holders (every sharded one); from here the step's collectives
        follow the backward pass's last reduce-scatter."""
        after, self.after_backward = self.after_backward, None
        ops.continue_after(after)
        return set(self.sharded)

    def forget_gathered(self) -> None:
        """Drops whole values kept for reads to come (the weights changed)."""
        self.waiting.clear()

    # -- reading whole outside the step -----------------------------------

    def whole(self, variable: Any) -> jax.Array:
        """The whole value of model variable `variable` (a collective unless
        inside `gathered_weights`, or kept from its group's gather)."""
        p = self.state.position(variable)
        if self.whole_values is not None:
            return jnp.asarray(self.whole_values[p])
        if p not in self.waiting:
            self.refuse_save_outside_block()
            self.waiting.update(self._gather_eagerly(self.group_of[p], "read"))
        return self.waiting.pop(p)

    def _gather_eagerly(self, group: Sequence[int], what: str) -> Dict[int, jax.Array]:
        number = self.state.groups.index(list(group))
        rows = {p: self._rows_now(p) for p in group}
        parts = self._parts(number, list(group))
        wholes, _ = self.gather_blocks([(number, parts)],
                                       [self._block(part, rows) for part in parts], what)
        return dict(zip([p for part in parts for p in part.members], wholes))

    def _rows_now(self, p: int) -> jax.Array:
        rows = compat.variable_storage(self.state.variables[p])
        if rows is None:
            raise RuntimeError(
                f"Weight {self.state.variables[p].path!r} is sharded (zero_stage=3) and its rows "
                "are inside Keras's running training step; read it after the step (a "
                "callback's `self.model` synchronises the state first).")
        return rows

    # -- blocks -----------------------------------------------------------

    def _parts(self, number: int, members: List[int]) -> List[_Part]:
        """The blocks of gather group `number` (its `members`), one per dtype."""
        state = self.state
        parts = []
        for k, (dtype, chosen) in enumerate(by_dtype(
                members, lambda p: keras.backend.standardize_dtype(
                    state.variables[p].dtype)).items()):
            positions = list(chosen)
            counts = [[self.held_elements(p, r) for p in positions]
                      for r in range(state.world_size)]
            parts.append(_Part(f"{number}.{k}", positions, counts,
                               max(sum(c) for c in counts), dtype))
        return parts

    def _block(self, part: _Part, rows: Dict[int, Any]) -> Any:
        """This rank's rows of the part's members, flat, padded."""
        own = part.counts[self.state.rank]
        pieces = [jnp.ravel(rows[p]) for p in part.members]
        if part.padded > sum(own):
            pieces.append(jnp.zeros((part.padded - sum(own),), part.dtype))
        return jnp.concatenate(pieces) if pieces else jnp.zeros((0,), part.dtype)

    def _cut(self, part: _Part, everyone: Any) -> List[Any]:
        """Each member's whole value from the gathered blocks (rank order is
        row order: Note [split variables])."""
        out = []
        for k, p in enumerate(part.members):
            pieces = []
            for rank in range(self.state.world_size):
                size = part.counts[rank][k]
                start = rank * part.padded + sum(part.counts[rank][:k])
                if size:
                    pieces.append(everyone[start:start + size])
            flat = pieces[0] if len(pieces) == 1 else jnp.concatenate(pieces) if pieces \
                else jnp.zeros((0,), part.dtype)
            out.append(jnp.reshape(flat, tuple(int(d) for d in self.state.variables[p].shape)))
        return out

    def _block_of_grads(self, part: _Part, mine: Dict[Tuple[int, int], Any]) -> Any:
        """This rank's reduced rows of the part's members (`mine`, by unit),
        as the block the gather took: flat, padded."""
        state = self.state
        pieces = []
        for k, p in enumerate(part.members):
            key = (p, -1) if state.owners[p] == state.rank else (p, state.rank)
            size = part.counts[state.rank][k]
            if size:
                pieces.append(jnp.ravel(mine[key]).astype(part.dtype))
        own = sum(part.counts[state.rank])
        if part.padded > own:
            pieces.append(jnp.zeros((part.padded - own,), part.dtype))
        return jnp.concatenate(pieces) if pieces else jnp.zeros((0,), part.dtype)

    # -- whole weights for a block, and writes ----------------------------

    def _whole_numpy(self, group: Sequence[int]) -> Dict[int, np.ndarray]:
        return {p: np.asarray(value)
                for p, value in self._gather_eagerly(group, "whole").items()}

    def _broadcast_whole(self, group: Sequence[int], root: int, name: str) -> List[Any]:
        return self._broadcast([jnp.asarray(self.whole_values[p]) for p in group], name, root)

    def _broadcast(self, values: List[Any], name: str, root: int) -> List[Any]:
        """`root`'s `values` on every rank: one broadcast per dtype. Collective."""
        set_id = process_sets.view(self.state.process_set).set_id
        values = list(values)
        for k, members in enumerate(
                by_dtype(list(range(len(values))), lambda i: str(values[i].dtype)).values()):
            for i, value in zip(members, ops.broadcast([values[i] for i in members],
                                                       f"{name}.{k}", root, set_id)):
                values[i] = value
        return values

    def assign_rows(self, variable: Any, value: Any) -> None:
        """Keeps this rank's rows of a whole `value` assigned to `variable`."""
        value = jnp.asarray(value, dtype=variable.dtype)
        self.forget_gathered()
        if self.whole_values is not None:  # later reads in the block see it whole
            self.whole_values[self.state.position(variable)] = np.array(value)
        compat.replace_variable_storage(variable, self._my_rows(variable, value))

    def _my_rows(self, variable: Any, whole: Any) -> Any:
        """This rank's rows of a whole value of `variable` (a scalar it holds
        as it is; none as a zero-row array)."""
        begin, end = self.state.held_rows(self.state.position(variable), self.state.rank)
        if variable.shape:
            return whole[begin:end]
        return whole if end > begin else jnp.zeros((0,), whole.dtype)

    def held_shape(self, variable: Any) -> Tuple[int, ...]:
        """The shape of this rank's rows of `variable`."""
        p = self.state.position(variable)
        begin, end = self.state.held_rows(p, self.state.rank)
        shape = tuple(int(d) for d in variable.shape)
        if not shape:
            return () if end > begin else (0,)
        return (end - begin,) + shape[1:]


def _differentiable_gather(parameters: JaxShardedParameters) -> Any:
    """`gather(layout, blocks)`: the whole values, differentiable, whose
    gradient is the reduce-scatter to the holders. `layout` is static."""

    def gather(layout, blocks):
        @jax.custom_vjp
        def run(blocks):
            return parameters.gather_blocks(layout, blocks, "params")[0]

        def forward(blocks):
            wholes, last = parameters.gather_blocks(layout, blocks, "params")
            # Only what orders the backward pass's chain after the gathers.
            return wholes, (None if last is None else last[:1])

        def backward(last, cotangents):
            return (parameters.reduce_blocks(layout, list(cotangents), last),)

        run.defvjp(forward, backward)
        return run(list(blocks))

    return gather


class JaxHoldingMixin:
    """Placed in front of a holding's class: the optimizer's variable for
    this rank's rows of a sharded weight, whose array the weight keeps."""

    _hvdkeras_rows_of: Any

    @property
    def value(self):
        mapped = compat.stateless_value(self)
        if mapped is not None:
            return compat.autocast_value(self, mapped)
        return compat.autocast_value(self, compat.variable_storage(self._hvdkeras_rows_of))

    def _direct_assign(self, value):
        if getattr(self, "_hvdkeras_rows_of", None) is None:  # while Keras makes it
            return super()._direct_assign(value)
        self._hvdkeras_rows_of._hvdkeras_parameters.forget_gathered()
        compat.replace_variable_storage(self._hvdkeras_rows_of, value)


class JaxShardedParameterMixin:
    """Placed in front of a model variable's class at stage 3 under JAX:
    reads are whole (rows while the trainer collects the step's state),
    writes keep this rank's rows (Note [sharded parameters under JAX])."""

    _hvdkeras_parameters: JaxShardedParameters

    @property
    def value(self):
        mapped = compat.stateless_value(self)
        if mapped is not None:
            return compat.autocast_value(self, mapped)
        if trainer_hooks.rows_being_read():
            return compat.variable_storage(self)
        if compat.variable_storage(self) is None:  # purged by the trainer: shape inference
            return super().value
        return compat.autocast_value(self, self._hvdkeras_parameters.whole(self))

    def assign(self, value):
        value = jnp.asarray(value, dtype=self.dtype)
        parameters = self._hvdkeras_parameters
        rows = parameters.held_shape(self)
        if (tuple(value.shape) == rows and rows != tuple(int(d) for d in self.shape)
                and not compat.in_stateless_scope()):
            # The trainer writing back a step's state: rows as they are.
            parameters.forget_gathered()
            compat.replace_variable_storage(self, value)
            return value
        return super().assign(value)

    def _direct_assign(self, value):
        self._hvdkeras_parameters.assign_rows(self, value)


def _as_rows(value: Any) -> Any:
    """A scalar as one row; other arrays as they are."""
    return jnp.reshape(value, (1,)) if value.ndim == 0 else value

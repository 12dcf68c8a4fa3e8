"""ZeRO stage 3 under TensorFlow: the model's trainable weights kept sharded
between steps, gathered whole where a step reads them, their gradients
reduce-scattered to the ranks that hold them.

Note [sharded parameters]
~~~~~~~~~~~~~~~~~~~~~~~~~
At stage 3 the plan of stages 1 and 2 (whole variables by owner, the
dominant ones cut into row blocks: Note [split variables] in `split_plan`)
also says where the weights live. When the optimizer is built, each model
variable's storage (the `tf.Variable` inside the Keras variable) is swapped
for this rank's rows of it: all of them on the owner of a whole variable,
its piece's rows on a rank holding a piece, no rows elsewhere. The
optimizer is built on plain Keras variables that share that storage (its
"holdings"), so its slots and checkpoints are stage 2's. The model variable
itself is given a class whose `value` is the whole weight: inside a traced
function, the first read of a variable gathers its group (consecutive
variables of about `GATHER_GROUP_BYTES`; one allgather per dtype, each rank
contributing its rows, which are in rank order) and later reads in the same
graph reuse the result; eagerly, a read gathers that variable alone, unless
`gathered_weights` holds every value for a block. The gather's gradient is
stage 2's reduce-scatter of the whole-variable gradients to their holders (`reduce_scatter_to_owners`: the
same units, blocks and summation order, so stage 3 gives stage 2's and
stage 0's weights bit for bit on one host), which is what the tape returns
for the holding. A sparse gradient (`tf.IndexedSlices`, an `Embedding`'s)
is not reduce-scattered: every rank's rows are gathered as at stage 0 and
each holder keeps the entries in its rows, still sparse, because Keras's
optimizers update only the rows a sparse gradient names (a dense one would
decay every row's moments). Assigning a whole value keeps this rank's rows. So a
read anywhere outside `gathered_weights` is a collective: every rank must
make the same reads in the same order, as with any hvdkeras collective.
The step's graph differs per rank (each updates its own rows), so these
collectives carry fixed names (Note [collective names]): one gather and one
reduce-scatter per group and graph, named after the group's first variable.
Each group's gradient is its own reduce-scatter, which runs as soon as the
backward pass has made that group's gradients, while it goes on with the
layers below.

What may import this module: `hvdkeras.sharding` and `hvdkeras.training`.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import keras
import numpy as np
import tensorflow as tf

from hvdkeras import compat
from hvdkeras.collectives import kernels
from hvdkeras.collectives.common import fixed_collective_names
from hvdkeras.collectives.reduction import grouped_allreduce
from hvdkeras.collectives.sparse import reduce_slices, rows_of_slices
from hvdkeras.engine import process_sets
from hvdkeras.engine.types import Sum
from hvdkeras.sharding.exchange import reduce_scatter_to_owners
from hvdkeras.sharding.parameters import ShardedWeights
from hvdkeras.sharding.plan import by_dtype
from hvdkeras.sharding.state import ShardState, answering_to, variable_rows


class Reduction(NamedTuple):
    """How the gradient step reduces: the op on the wire, its scale factors,
    the compression's two halves, and whether sparse gradients are densified."""

    wire_op: int
    prescale: float
    postscale: float
    compress: Callable
    decompress: Callable
    sparse_as_dense: bool = False


class ShardedParameters(ShardedWeights):
    """The rows of the model's weights this rank holds, and how to make
    them whole (Note [sharded parameters]).

    Args:
        state: The optimizer's shard (its plan is the weights' too).
        reduction: How gradients are reduced (a `Reduction`).
    """

    def __init__(self, state: ShardState, reduction: Reduction) -> None:
        super().__init__(state)
        self.reduction = reduction
        self._graphs: "weakref.WeakKeyDictionary[Any, Dict[int, tf.Tensor]]" = (
            weakref.WeakKeyDictionary())

    # -- taking the weights over ------------------------------------------

    def rows(self, p: int, rank: int) -> Tuple[int, int]:
        """Rows [begin, end) of variable `p` that `rank` holds."""
        return self.state.held_rows(p, rank)

    def _take_rows(self, number: int, group: Sequence[int]) -> List[Optional[keras.Variable]]:
        state = self.state  # eagerly: never inside a traced step
        values = [tf.convert_to_tensor(compat.variable_storage(state.variables[p]))
                  for p in group]
        if state.world_size > 1:  # one group at a time: bounded memory
            set_id = process_sets.view(state.process_set).set_id
            values = kernels.broadcast(values, 0, f"{state.name}_take_over_{number}", set_id)
        holdings: List[Optional[keras.Variable]] = []
        for p, value in zip(group, values):
            begin, end = self.rows(p, state.rank)
            holdings.append(_plain_rows(state.variables[p], value, begin, end)
                            if end > begin else None)
        return holdings

    def take_over(self) -> None:
        """Swaps each sharded model variable's storage for this rank's rows
        (the holding's `tf.Variable`, or one with no rows) and gives it the
        class that reads it whole."""
        state = self.state
        for p in self.sharded:
            variable = state.variables[p]
            if p in self.holdings:
                storage = compat.variable_storage(self.holdings[p])
            else:
                with tf.init_scope():
                    shape = [0] + [int(d) for d in variable.shape[1:]]
                    storage = tf.Variable(tf.zeros(shape, variable.dtype), trainable=True,
                                          name=str(variable.name).split(":")[0])
            compat.replace_variable_storage(variable, storage)
            variable.__class__ = compat.with_mixin(ShardedParameterMixin, type(variable))
            variable._hvdkeras_parameters = self

    # -- reading whole ----------------------------------------------------

    def whole(self, variable: Any) -> tf.Tensor:
        """The whole value of model variable `variable` (a collective unless
        inside `gathered_weights`)."""
        p = self.state.position(variable)
        if self.whole_values is not None:
            return tf.constant(self.whole_values[p])
        if tf.executing_eagerly():
            self.refuse_save_outside_block()
            return self._gather([p])[p]
        graph = tf.compat.v1.get_default_graph()
        cache = self._graphs.setdefault(graph, {})
        if p not in cache:
            cache.update(self._gather(self.group_of[p]))
        return cache[p]

    def _gather(self, positions: Sequence[int]) -> Dict[int, tf.Tensor]:
        """Whole values of `positions` (one allgather per dtype); their
        gradient is the reduce-scatter to the holders."""
        state = self.state
        storage = [compat.variable_storage(state.variables[p]) for p in positions]
        shapes = [tuple(int(d) for d in state.variables[p].shape) for p in positions]
        set_id = process_sets.view(state.process_set).set_id
        # Unique within a step: a group is named by its first position.
        suffix = f"_{positions[0]}"

        @tf.custom_gradient
        def gather(*held):
            groups = by_dtype(list(range(len(held))), lambda k: held[k].dtype)
            gathered: List[Any] = [None] * len(held)
            for number, members in enumerate(groups.values()):
                name = f"{state.name}_params{suffix}_{number}"
                with fixed_collective_names():
                    if kernels.in_xla():
                        outputs = self._sum_of_rows([positions[k] for k in members],
                                                    [held[k] for k in members], name)
                    else:
                        outputs = kernels.allgather([_as_rows(held[k]) for k in members], name,
                                                    set_id)
                for k, value in zip(members, outputs):
                    gathered[k] = tf.reshape(value, shapes[k])

            def grad(*upstream):
                return self._reduce_to_holders(positions, upstream, held, suffix)

            return gathered, grad

        return dict(zip(positions, gather(*[tf.convert_to_tensor(s) for s in storage])))

    def _sum_of_rows(self, positions: Sequence[int], held: Sequence[tf.Tensor],
                     name: str) -> List[tf.Tensor]:
        """Whole values under XLA, which has no compiled allgather (Note [xla
        collectives]): each rank's rows placed in zeros and summed across
        ranks (one allreduce; the same values, at about twice the bytes)."""
        padded = []
        for p, h in zip(positions, held):
            begin, end = self.rows(p, self.state.rank)
            total = variable_rows(self.state.variables[p])
            rows = _as_rows(h)
            padded.append(tf.pad(rows, [[begin, total - end]] + [[0, 0]] * (rows.shape.rank - 1)))
        return grouped_allreduce(padded, name=name, op=Sum, process_set=self.state.process_set)

    def _reduce_to_holders(self, positions: Sequence[int], upstream: Sequence[Any],
                           held: Sequence[tf.Tensor], suffix: str) -> List[Any]:
        """The gradient of each holding: its rows of the whole gradients,
        summed (or averaged) across ranks; no rows where it holds none.
        A sparse gradient (an `Embedding`'s) stays sparse: every rank's rows
        are gathered as at stage 0 and each holder keeps those in its rows,
        so the optimizer updates what it would on one process."""
        state = self.state
        reduction = self.reduction
        dense, contexts, sparse = {}, {}, {}
        for p, dy, h in zip(positions, upstream, held):
            if dy is None:
                dy = tf.zeros(state.variables[p].shape, h.dtype)
            if self._stays_sparse(dy):
                sparse[p] = dy
                continue
            compressed, contexts[p] = reduction.compress(_as_rows(tf.convert_to_tensor(dy)))
            dense[p] = compressed
        mine: Dict[Tuple[int, int], tf.Tensor] = {}
        if dense:
            units, owner_of = state.units(dense)
            with fixed_collective_names():
                mine = reduce_scatter_to_owners(
                    units, owner_of, state.rank, state.world_size,
                    f"{state.name}_param_grads{suffix}", reduction.wire_op, reduction.prescale,
                    reduction.postscale, state.process_set)
        gathered: Dict[int, tf.IndexedSlices] = {}
        if sparse:
            with fixed_collective_names():
                gathered = dict(zip(sparse, reduce_slices(
                    list(sparse.values()), reduction.wire_op, reduction.prescale,
                    reduction.postscale, reduction.compress, reduction.decompress,
                    f"{state.name}_param_sparse{suffix}",
                    process_sets.view(state.process_set))))
        grads: List[Any] = []
        for p, h in zip(positions, held):
            begin, end = self.rows(p, state.rank)
            key = (p, -1) if state.owners[p] == state.rank else (p, state.rank)
            if p in gathered and end > begin:
                grads.append(rows_of_slices(gathered[p], begin, end))
            elif key in mine:
                grads.append(tf.reshape(reduction.decompress(mine[key], contexts[p]), tf.shape(h)))
            else:
                grads.append(tf.zeros_like(h))
        return grads

    def _stays_sparse(self, gradient: Any) -> bool:
        """Whether a gradient travels as gathered rows (as at stages 0-2)."""
        return (isinstance(gradient, tf.IndexedSlices) and not self.reduction.sparse_as_dense
                and not kernels.in_xla())

    def _whole_numpy(self, group: Sequence[int]) -> Dict[int, np.ndarray]:
        return {p: v.numpy() for p, v in self._gather(group).items()}

    def _broadcast_whole(self, group: Sequence[int], root: int, name: str) -> List[Any]:
        set_id = process_sets.view(self.state.process_set).set_id
        return kernels.broadcast([tf.constant(self.whole_values[p]) for p in group], root, name,
                                 set_id)

    def assign_rows(self, variable: Any, value: Any) -> None:
        """Keeps this rank's rows of a whole `value` assigned to `variable`."""
        p = self.state.position(variable)
        begin, end = self.rows(p, self.state.rank)
        value = tf.cast(_as_rows(tf.convert_to_tensor(value)), variable.dtype)
        if self.whole_values is not None:  # later reads in the block see it whole
            self.whole_values[p] = np.reshape(value.numpy(), self.whole_values[p].shape)
        storage = compat.variable_storage(variable)
        storage.assign(tf.reshape(value[begin:end], tf.shape(storage)))


class ShardedParameterMixin:
    """Placed in front of a model variable's class at stage 3: reads are
    whole, writes keep this rank's rows (Note [sharded parameters])."""

    _hvdkeras_parameters: ShardedParameters

    @property
    def value(self):
        mapped = compat.stateless_value(self)
        if mapped is not None:
            return compat.autocast_value(self, mapped)
        return compat.autocast_value(self, self._hvdkeras_parameters.whole(self))

    @property
    def handle(self):
        # The tape and tf.Variable APIs reach the rows this rank holds.
        return compat.variable_storage(self).handle

    def _direct_assign(self, value):
        self._hvdkeras_parameters.assign_rows(self, value)


def _as_rows(tensor: tf.Tensor) -> tf.Tensor:
    """A scalar as one row; other tensors as they are."""
    return tf.reshape(tensor, [1]) if tensor.shape.rank == 0 else tensor


def _plain_rows(variable: Any, whole: tf.Tensor, begin: int, end: int) -> keras.Variable:
    """A plain Keras variable holding rows [begin, end) of `whole` (all of a
    scalar), under `variable`'s name and path. Trainable, so that a tape
    watches its reads (it becomes the model variable's storage)."""
    with tf.init_scope():
        # A copy of its own: a slice can share the whole tensor's buffer, and
        # a variable made from it would keep all of that memory alive.
        rows = tf.raw_ops.DeepCopy(x=whole if whole.shape.rank == 0 else whole[begin:end])
        holding = keras.Variable(rows, dtype=variable.dtype, trainable=True,
                                 name=str(variable.name).split(":")[0])
    return answering_to(variable, holding)


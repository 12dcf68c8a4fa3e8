"""ZeRO stage 3 under Keras's torch backend: the model's trainable weights
kept sharded between steps, gathered whole where a step reads them, their
gradients reduce-scattered to the ranks that hold them.

Note [sharded parameters under torch]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The plan is TensorFlow's (Note [sharded parameters] in
`hvdkeras/sharding/tf_parameters.py`): the same gather groups, owners and
row blocks. What differs is how the weights are read:

- Storage. Each model variable's `torch.nn.Parameter` keeps its identity
  (Keras's layers register it with torch as a module parameter) and has its
  data replaced by this rank's rows, so `model.parameters()`, the trainer's
  `zero_grad()` and torch's own memory all see the shard. The optimizer is
  built on plain Keras variables around the same parameters ("holdings").
- Reads. torch runs eagerly, so there is no traced graph to cache a gather
  in. The first read of a variable gathers its whole group (one allgather
  per dtype, every rank's rows in rank order, inside an autograd function
  whose backward is the reduce-scatter of the group's gradients to their
  holders, with stage 2's units and summation order); the other members
  wait in a cache, and each is taken out of it by its own first read, so a
  forward pass gathers each group once and nothing whole outlives the pass
  that read it. An update or an assignment empties the cache. With
  `HVDKERAS_ZERO3_PREFETCH=1` the next group's gather starts as soon as a
  group is read, so it moves while the layer computes (Note [gathers
  started ahead] in `hvdkeras/sharding/gathers_ahead.py`).
- Freed after the forward pass. A whole weight that an operation saves for
  its backward pass (a matmul keeps its weight) would stay alive until then,
  so a step would hold every weight whole at its peak. While a step's
  gathered weights are live, saved-tensor hooks
  (`torch.autograd.graph.saved_tensors_hooks`) pack such a weight as a
  token, so the whole tensor is freed once the forward pass is done with
  it; the backward pass's first unpacking of a token gathers the group
  again, kept until each of its saved copies has been unpacked (FSDP's
  resharding after the forward pass). One more allgather per group and
  step; `HVDKERAS_ZERO3_REGATHER=0` keeps the weights from the forward pass
  instead (faster, more memory).
- Gradients. The backward pass leaves each holding's reduced rows in its
  parameter's `.grad`. Keras's trainer then reads `variable.value.grad`: a
  variable whose gradient has arrived answers that read with its holding
  parameter, so the trainer hands the optimizer the rows, as TensorFlow's
  tape does. `DistributedOptimizer.apply` takes them and clears the marks.
- Registration. A Keras model registers its variables with torch lazily
  (at its first `parameters()`, which the trainer's `zero_grad()` calls);
  that read gets the parameter holding the rows
  (`compat.keras_torch_tracking_read`), so torch never keeps a whole copy.

What may import this module: `hvdkeras.backends.sharded_optimizer` (lazily,
under the torch backend).
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import keras
import numpy as np
import torch

from hvdkeras import compat
from hvdkeras.backends.sharded_exchange import reduce_scatter_to_owners
from hvdkeras.backends.torch import group_gathers, ops as torch_ops
from hvdkeras.engine import config, process_sets
from hvdkeras.sharding.gathers_ahead import GathersAhead
from hvdkeras.sharding.plan import by_dtype
from hvdkeras.sharding.parameters import ShardedWeights
from hvdkeras.sharding.state import ShardState, answering_to


class TorchShardedParameters(ShardedWeights):
    """The rows of the model's weights this rank holds under torch, and how
    to make them whole (Note [sharded parameters under torch]).

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
        self.waiting: Dict[int, torch.Tensor] = {}
        self.arrived: Set[int] = set()
        self.gathers = 0
        self.regathering = config.zero3_regather()
        # While a step's whole weights are live: each by id (with a weak
        # reference, to tell a reused id), the copies of each weight that
        # operations saved as tokens, and the regathered values they wait for.
        self.live: Dict[int, Tuple[Any, int]] = {}
        self.packed: Dict[int, int] = {}
        self.refilled: Dict[int, torch.Tensor] = {}
        self.hooks: Optional[Any] = None
        self.ahead = GathersAhead(config.zero3_prefetch(), group_gathers.drop)

    # -- taking the weights over ------------------------------------------

    def _take_rows(self, number: int, group: Sequence[int]) -> List[Optional[keras.Variable]]:
        """Cuts each parameter of the group down to this rank's rows of rank
        0's values, in place (the parameter keeps its identity); the
        holdings are plain variables around those parameters."""
        state = self.state
        params = [compat.variable_storage(state.variables[p]) for p in group]
        if state.world_size > 1:  # the weights start as rank 0's
            set_id = process_sets.view(state.process_set).set_id
            torch_ops.broadcast_in_place([q.data for q in params],
                                         f"{state.name}_take_over_{number}", 0, set_id)
        holdings: List[Optional[keras.Variable]] = []
        for p, param in zip(group, params):
            begin, end = state.held_rows(p, state.rank)
            variable = state.variables[p]
            whole = param.data
            with torch.no_grad():
                # A copy of its own, so the whole tensor's memory is freed.
                param.data = (whole if not variable.shape else whole[begin:end]).clone() \
                    if end > begin else whole.new_empty((0,) + tuple(whole.shape[1:]))
            holdings.append(answering_to(variable, keras.Variable(
                param, trainable=True, name=str(variable.name).split(":")[0]))
                if end > begin else None)
        return holdings

    def take_over(self) -> None:
        """Gives each sharded model variable the class that reads it whole."""
        for p in self.sharded:
            variable = self.state.variables[p]
            variable.__class__ = compat.with_mixin(TorchShardedParameterMixin, type(variable))
            variable._hvdkeras_parameters = self

    # -- reading whole ----------------------------------------------------

    # Not traced by torch.compile (`jit_compile=True`): its cache and the
    # engine's calls are Python state that dynamo would recompile for on
    # every step; the compiled step calls it as it is.
    @torch.compiler.disable
    def whole(self, variable: Any) -> torch.Tensor:
        """The whole value of model variable `variable` (a collective unless
        inside `gathered_weights`, or cached from its group's gather)."""
        p = self.state.position(variable)
        if self.whole_values is not None:
            return torch.from_numpy(self.whole_values[p])
        param = compat.variable_storage(variable)
        if p in self.arrived and param.grad is not None:
            return param  # the trainer reading `.grad` after the backward pass
        if p not in self.waiting:
            self.refuse_save_outside_block()
            self.waiting.update(self._gather(self.group_of[p]))
        return self.waiting.pop(p)

    def take_arrived(self) -> Set[int]:
        """The positions whose gradients the backward pass reduced to their
        holders since the last call; clears the marks and the cache."""
        arrived, self.arrived = self.arrived, set()
        self.forget_gathered()
        return arrived

    def forget_gathered(self) -> None:
        """Drops whole values kept for reads to come (the weights changed)
        and stops packing saved weights as tokens until the next gather."""
        self.ahead.drop_all()
        self.waiting.clear()
        self.live.clear()
        self.packed.clear()
        self.refilled.clear()
        if self.hooks is not None:
            hooks, self.hooks = self.hooks, None
            hooks.__exit__(None, None, None)

    def _gather(self, positions: Sequence[int]) -> Dict[int, torch.Tensor]:
        params = [compat.variable_storage(self.state.variables[p]) for p in positions]
        self.gathers += 1
        wholes = _GatherGroup.apply(self, list(positions), *params)
        if self.regathering and torch.is_grad_enabled():
            for p, whole in zip(positions, wholes):
                self.live[id(whole)] = (weakref.ref(whole), p)
            if self.hooks is None:
                self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
                self.hooks.__enter__()
        return dict(zip(positions, wholes))

    def _pack(self, tensor: torch.Tensor) -> Any:
        """A saved tensor as autograd keeps it: a whole weight as a token."""
        ref, p = self.live.get(id(tensor), (None, -1))
        if ref is None or ref() is not tensor:
            return tensor
        self.packed[p] = self.packed.get(p, 0) + 1
        return _SavedWeight(p)

    def _unpack(self, saved: Any) -> torch.Tensor:
        """A saved tensor back for the backward pass: a token's weight
        gathered again (its whole group, once)."""
        if not isinstance(saved, _SavedWeight):
            return saved
        p = saved.position
        if p not in self.refilled:
            group = self.group_of[p]
            held = [compat.variable_storage(self.state.variables[q]).detach() for q in group]
            with torch.no_grad():
                values = self.gather_whole(group, held, "regather", ahead=True)
            self.gathers += 1
            self.refilled.update({q: v for q, v in zip(group, values) if self.packed.get(q)})
        value = self.refilled[p]
        self.packed[p] -= 1
        if not self.packed[p]:
            del self.packed[p], self.refilled[p]
        return value

    def gather_whole(self, positions: Sequence[int], held: Sequence[torch.Tensor],
                     what: str = "params", ahead: bool = False) -> List[torch.Tensor]:
        """Whole values of `positions` from every rank's rows (`held` are
        this rank's): one allgather per dtype, named `what` and the group,
        or the one started ahead for it. `ahead`: a pass's read, which may
        start the next group's gather (Note [gathers started ahead])."""
        state = self.state
        started = self.ahead.take(what, positions[0])
        following = self.ahead.read(what, positions[0]) if ahead else None
        if following is not None:
            group = self.group_of[following]
            rows = [compat.variable_storage(state.variables[q]).detach() for q in group]
            self.ahead.start(what, following, group_gathers.start_gather(
                rows, f"{state.name}_{what}_{following}",
                process_sets.view(state.process_set).set_id))
        if started is None:
            return self._gather_now(positions, held, what)
        shapes = [tuple(int(d) for d in state.variables[p].shape) for p in positions]
        return group_gathers.finish_gather(
            started, shapes, lambda k, rank: self.held_elements(positions[k], rank),
            state.world_size)

    def _gather_now(self, positions: Sequence[int], held: Sequence[torch.Tensor],
                    what: str) -> List[torch.Tensor]:
        """Whole values of `positions` from every rank's rows (`held` are
        this rank's): one allgather per dtype, named `what` and the group,
        waited for here."""
        state = self.state
        set_id = process_sets.view(state.process_set).set_id
        out: List[Optional[torch.Tensor]] = [None] * len(positions)
        shapes = [tuple(int(d) for d in state.variables[p].shape) for p in positions]
        groups = by_dtype(list(range(len(positions))), lambda k: str(held[k].dtype))
        for number, members in enumerate(groups.values()):
            mine = torch.cat([held[k].reshape(-1) for k in members]) if members else None
            everyone = torch_ops.allgather(mine, f"{state.name}_{what}_{positions[0]}_{number}",
                                           set_id)
            group_gathers.cut_whole(everyone, members, shapes,
                                    lambda k, rank: self.held_elements(positions[k], rank),
                                    state.world_size, out)
        return out  # type: ignore[return-value]

    @torch.compiler.disable  # as `whole`: Python state, run as it is
    def reduce_to_holders(self, positions: Sequence[int], upstream: Sequence[torch.Tensor],
                          held: Sequence[torch.Size]) -> List[torch.Tensor]:
        """Each holding's gradient: its rows of the whole gradients, reduced
        across ranks (stage 2's reduce-scatter); no rows where it holds none."""
        state = self.state
        op, prescale, postscale = self.scaling
        rows = {p: _as_rows(g) for p, g in zip(positions, upstream)}
        units, owner_of = state.units(rows)
        mine = reduce_scatter_to_owners(units, owner_of, state.rank, state.world_size,
                                        f"{state.name}_param_grads_{positions[0]}", op,
                                        prescale, postscale, state.process_set,
                                        self.settings["compression"])
        grads = []
        for p, shape, dy in zip(positions, held, upstream):
            key = (p, -1) if state.owners[p] == state.rank else (p, state.rank)
            grads.append(mine[key].reshape(shape) if key in mine
                         else torch.zeros(shape, dtype=dy.dtype))
            self.arrived.add(p)
        return grads

    # -- whole weights for a block, and writes ----------------------------

    def _whole_numpy(self, group: Sequence[int]) -> Dict[int, np.ndarray]:
        held = [compat.variable_storage(self.state.variables[p]).data for p in group]
        with torch.no_grad():
            return {p: value.numpy() for p, value in zip(group, self.gather_whole(group, held))}

    def _broadcast_whole(self, group: Sequence[int], root: int, name: str) -> List[Any]:
        values = [torch.from_numpy(np.ascontiguousarray(self.whole_values[p])) for p in group]
        torch_ops.broadcast_in_place(values, name, root,
                                     process_sets.view(self.state.process_set).set_id)
        return values

    def assign_rows(self, variable: Any, value: Any) -> None:
        """Keeps this rank's rows of a whole `value` assigned to `variable`."""
        p = self.state.position(variable)
        begin, end = self.state.held_rows(p, self.state.rank)
        value = keras.ops.convert_to_tensor(value, dtype=variable.dtype)
        self.forget_gathered()
        if self.whole_values is not None:  # later reads in the block see it whole
            self.whole_values[p] = np.array(value.detach().cpu().numpy())
        param = compat.variable_storage(variable)
        with torch.no_grad():
            if end > begin:
                param.data.copy_(value if not variable.shape else value[begin:end])


class _SavedWeight:
    """What autograd keeps of a saved whole weight: its position."""

    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position


class _GatherGroup(torch.autograd.Function):
    """Whole values of a group from the rows each rank holds; the gradient
    goes back to the holders as a reduce-scatter."""

    @staticmethod
    def forward(ctx, parameters: TorchShardedParameters, positions: List[int],
                *held: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.parameters, ctx.positions = parameters, positions
        ctx.shapes = [h.shape for h in held]
        return tuple(parameters.gather_whole(positions, [h.detach() for h in held],
                                             ahead=True))

    @staticmethod
    def backward(ctx, *upstream: torch.Tensor):
        grads = ctx.parameters.reduce_to_holders(ctx.positions, list(upstream), ctx.shapes)
        return (None, None, *grads)


class TorchShardedParameterMixin:
    """Placed in front of a model variable's class at stage 3 under torch:
    reads are whole, writes keep this rank's rows (Note [sharded parameters
    under torch])."""

    _hvdkeras_parameters: TorchShardedParameters

    @property
    def value(self):
        mapped = compat.stateless_value(self)
        if mapped is not None:
            return compat.autocast_value(self, mapped)
        if compat.torch_symbolic_device():
            # Keras infers shapes on torch's meta device: a stand-in of the
            # whole shape, as Keras's own variables give there.
            return torch.empty(tuple(int(d) for d in self.shape),
                               dtype=compat.variable_storage(self).dtype, device="meta")
        if compat.keras_torch_tracking_read():
            return compat.variable_storage(self)
        return compat.autocast_value(self, self._hvdkeras_parameters.whole(self))

    def _direct_assign(self, value):
        self._hvdkeras_parameters.assign_rows(self, value)


def _as_rows(tensor: torch.Tensor) -> torch.Tensor:
    """A scalar as one row; other tensors as they are."""
    return tensor.reshape(1) if tensor.dim() == 0 else tensor

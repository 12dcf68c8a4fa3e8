"""What a sharded optimizer knows about its shard, and how its variables
line up with an unsharded optimizer's.

Note [stand-ins keep the layout]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
A sharded optimizer is built on the full variable list, but every variable
another rank owns is replaced by a stand-in: a one-element-per-axis variable
with the same rank, dtype and path. So the optimizer creates exactly the
variables, in exactly the order, that an unsharded one creates (whatever its
`build` does: Adam's moment lists, Adafactor's factored rows and columns,
Muon's choice of update by path and rank, Nadam's shared product, EMA and
accumulators), with full-size slots only for its own variables. Keeping
that layout is what makes a sharded checkpoint a normal one: slot i of the
file is slot i of the optimizer on every rank, its value held by the owner
of the variable it belongs to. Which variable a slot belongs to is read from
the optimizer's per-variable lists (every built-in optimizer keeps its slots
in lists indexed like the variables); variables in no such list (the
iteration count, the learning rate, Nadam's product) are shared and equal
on every rank.

Note [scratch variables are not state]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Under JAX a jitted step can only carry state that the optimizer's variables
hold, so what hvdkeras keeps between steps there (each rank's sums of the
passes of an accumulation window) is added to the optimizer as variables of
its own, last, and marked `SCRATCH` in the layout. They are the same shape on
every rank, but they are not the plain optimizer's state: saving and loading
skip them (a file stays a normal one), and gathering and scattering leave
them alone. Broadcasts of the optimizer's variables include them, so every
rank starts from the same count.

What may import this module: `hvdkeras.sharding` and `hvdkeras.backends`.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, List, Optional, Sequence, Tuple

import keras
import numpy as np

from hvdkeras import compat
from hvdkeras.engine import config
from hvdkeras.sharding.plan import GATHER_GROUP_BYTES, REPLICATED, SPLIT
from hvdkeras.sharding.split_plan import Piece, plan_in_groups, plan_split

SHARED = -2
"""The layout entry of an optimizer variable that belongs to no one variable."""

SCRATCH = -3
"""The layout entry of a variable hvdkeras added to the optimizer for its own
bookkeeping (Note [scratch variables are not state])."""


def variable_bytes(variable: Any) -> int:
    """Bytes of a variable's value (elements times item size)."""
    shape = tuple(int(d) for d in variable.shape)
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(keras.backend.standardize_dtype(
        variable.dtype)).itemsize


def _outside_functions() -> ContextManager[Any]:
    """Where a variable made while a `tf.function` is traced must be created
    (outside the function's graph); other backends need nothing."""
    if keras.backend.backend() != "tensorflow":
        return contextlib.nullcontext()
    import tensorflow as tf  # lazy: TensorFlow's scope, under that backend only

    return tf.init_scope()


def answering_to(variable: Any, other: keras.Variable) -> keras.Variable:
    """`other`, given `variable`'s path and its `overwrite_with_gradient`:
    optimizers choose per variable by path (Muon: embeddings, excluded
    layers), so what an optimizer is built on in `variable`'s place must
    answer to it."""
    compat.set_variable_path(other, getattr(variable, "path", other.path))
    if getattr(variable, "overwrite_with_gradient", False):
        other.overwrite_with_gradient = True
    return other


def make_stand_in(variable: Any) -> keras.Variable:
    """A one-element-per-axis variable that answers to `variable`'s path."""
    with _outside_functions():
        stand_in = keras.Variable(initializer="zeros", shape=(1,) * len(variable.shape),
                                  dtype=variable.dtype, trainable=False,
                                  name=str(variable.name).split(":")[0])
    return answering_to(variable, stand_in)


def make_piece(variable: Any, piece: Piece) -> keras.Variable:
    """A variable for rows [piece.begin, piece.end) of `variable`, under its
    name and path (Note [split variables] in `split_plan`): the optimizer
    updates it, and its slots have its shape. Its value is refreshed from
    the variable before each update."""
    shape = (piece.end - piece.begin,) + tuple(int(d) for d in variable.shape[1:])
    with _outside_functions():
        part = keras.Variable(initializer="zeros", shape=shape, dtype=variable.dtype,
                              trainable=False, name=str(variable.name).split(":")[0])
    return answering_to(variable, part)


def variable_rows(variable: Any) -> int:
    """The rows a variable may be cut into: its first dimension (1 for a scalar)."""
    return int(variable.shape[0]) if len(variable.shape) else 1


def slot_layout(optimizer: Any, built_for: Sequence[Any]) -> List[int]:
    """For each of `optimizer.variables`: the position of the variable it
    belongs to, or `SHARED`.

    Args:
        optimizer: A built Keras optimizer.
        built_for: The list it was built with (stand-ins included).

    Returns:
        One entry per optimizer variable, in `optimizer.variables` order.
    """
    variables = list(optimizer.variables)
    index = {id(v): i for i, v in enumerate(variables)}
    layout = [SHARED] * len(variables)
    count = len(built_for)
    skip = {"_variables", "_trainable_variables"}
    for attribute, value in sorted(vars(optimizer).items()):
        if attribute in skip or not isinstance(value, (list, tuple)) or len(value) != count:
            continue
        if not any(id(x) in index for x in value):
            continue
        if not all(x is None or id(x) in index for x in value):
            continue
        for position, slot in enumerate(value):
            if slot is not None:
                layout[index[id(slot)]] = position
    return layout


class ShardState:
    """The shard of one optimizer: its plan, stand-ins and slot layout.

    Args:
        rank: This rank's position in the process set.
        world_size: The process set's size.
        name: Prefix of the shard's collective names.
        process_set: The ranks that share the state.
        stage: 1, 2 or 3 (see `hvdkeras.DistributedOptimizer`).
        can_split: Whether this backend's step can move pieces of variables
            (Note [split variables] in `split_plan`).
    """

    def __init__(self, rank: int, world_size: int, name: str, process_set: Any,
                 stage: int, can_split: bool = False) -> None:
        self.can_split = can_split
        self.pieces: Dict[int, List[Piece]] = {}
        # This rank's piece of each split variable it holds a piece of, and
        # the variable the optimizer updates for it.
        self.piece_variables: Dict[int, Any] = {}
        self.rank = rank
        self.world_size = world_size
        self.name = name
        self.process_set = process_set
        self.stage = stage
        self.replicated_ids: set = set()
        self.variables: List[Any] = []
        self.owners: List[int] = []
        self.positions: Dict[int, int] = {}
        self.built_for: List[Any] = []
        self.layout: List[int] = []
        # Stage 3's gather groups (`split_plan.plan_in_groups`).
        self.groups: List[List[int]] = []
        # On the root rank only, between a collective step and the file
        # access it serves: values of slots other ranks own, by index.
        self.gathered: Optional[Dict[int, np.ndarray]] = None
        self.pending: Optional[Dict[int, np.ndarray]] = None
        self.collecting = False
        # The replicated flags of the gradients now being applied, in order
        # (read by the global-norm clipping of the same step).
        self.applying_replicated: List[bool] = []

    def plan(self, variables: Sequence[Any], elementwise: bool = False) -> List[Any]:
        """Plans the shard for `variables`; returns the list to build on.
        `elementwise`: the optimizer's update is elementwise, so variables
        may be cut (where this backend can, Note [split variables])."""
        self.variables = list(variables)
        self.positions = {id(v): i for i, v in enumerate(self.variables)}
        replicated = {i for i, v in enumerate(self.variables) if id(v) in self.replicated_ids}
        cuttable = (set(range(len(self.variables))) - replicated
                    if elementwise and self.can_split else set())
        sizes = [variable_bytes(v) for v in self.variables]
        rows = [variable_rows(v) for v in self.variables]
        if self.stage == 3:  # each gather group shared out on its own
            self.owners, self.pieces, self.groups = plan_in_groups(
                sizes, rows, self.world_size, replicated, cuttable,
                config.zero3_group_bytes(GATHER_GROUP_BYTES))
        else:
            self.owners, self.pieces = plan_split(sizes, rows, self.world_size, replicated,
                                                  cuttable)
        # At stage 3 the pieces are the weights' storage, made by the backend
        # from rank 0's values (Note [sharded parameters]).
        self.piece_variables = {} if self.stage == 3 else {
            p: make_piece(self.variables[p], self.piece_of(p, self.rank))
            for p in self.pieces if self.piece_of(p, self.rank)}
        self.built_for = [self.piece_variables[i] if i in self.piece_variables
                          else v if self.keeps(i) else make_stand_in(v)
                          for i, v in enumerate(self.variables)]
        return self.built_for

    def held_rows(self, position: int, rank: int) -> Tuple[int, int]:
        """Rows [begin, end) of variable `position` that `rank` holds: all of
        a whole variable on its owner, a piece's rows, else none (at stage 3,
        where the weights themselves are sharded: Note [sharded parameters])."""
        if self.owners[position] == rank:
            return 0, variable_rows(self.variables[position])
        piece = self.piece_of(position, rank)
        return (piece.begin, piece.end) if piece is not None else (0, 0)

    def keeps(self, position: int) -> bool:
        """Whether this rank holds the real state of `position` (or of a piece of it)."""
        owner = self.owners[position]
        return owner in (self.rank, REPLICATED) or (
            owner == SPLIT and self.piece_of(position, self.rank) is not None)

    def units(self, values: Dict[int, Any]) -> Tuple[Dict[Tuple[int, int], Any],
                                                      Dict[Tuple[int, int], int]]:
        """`values` (gradients or weights by position) as the units the
        exchanges move: a whole variable's, keyed (p, -1), and each piece of
        a split one's rows, keyed (p, rank) (Note [split variables]); and
        each unit's owner. Slicing is the backend tensors' own."""
        units: Dict[Tuple[int, int], Any] = {}
        owner_of: Dict[Tuple[int, int], int] = {}
        for p, value in values.items():
            pieces = self.pieces.get(p)
            if not pieces:
                units[(p, -1)], owner_of[(p, -1)] = value, self.owners[p]
                continue
            for piece in pieces:
                units[(p, piece.rank)] = value[piece.begin:piece.end]
                owner_of[(p, piece.rank)] = piece.rank
        return units, owner_of

    def weight_units(self, read: Any) -> Tuple[Dict[Tuple[int, int], Any],
                                               Dict[Tuple[int, int], int]]:
        """The weights to share after an update, as `units` lays them out:
        `read(variable)` of every variable that is not replicated, this
        rank's pieces from its piece variables (which hold the update), the
        other ranks' pieces as the variable's rows (only their shapes are
        read: their holders send them)."""
        units, owner_of = self.units({p: read(v) for p, v in enumerate(self.variables)
                                      if self.owners[p] != REPLICATED})
        for p, part in self.piece_variables.items():
            units[(p, self.rank)] = read(part)
        return units, owner_of

    def piece_of(self, position: int, rank: int) -> Optional[Piece]:
        """`rank`'s piece of a split variable, or None (not split, or no piece there)."""
        return next((piece for piece in self.pieces.get(position, ()) if piece.rank == rank),
                    None)

    def position(self, variable: Any) -> int:
        try:
            return self.positions[id(variable)]
        except KeyError:
            raise ValueError(
                f"Variable {getattr(variable, 'path', variable)!r} was not among the variables "
                "this sharded optimizer was built with; a sharded optimizer needs the same "
                "trainable variables on every call.") from None

    def is_own_slot(self, index: int) -> bool:
        """Whether optimizer variable `index` is a slot of a variable this rank owns alone."""
        p = self.layout[index]
        return p >= 0 and self.owners[p] == self.rank

    def is_piece_slot(self, index: int) -> bool:
        """Whether optimizer variable `index` is a slot of a split variable
        (each rank holding a piece keeps that piece of it)."""
        p = self.layout[index]
        return p >= 0 and self.owners[p] == SPLIT

    def is_everywhere(self, index: int) -> bool:
        """Whether optimizer variable `index` has the same shape on every rank."""
        p = self.layout[index]
        return p in (SHARED, SCRATCH) or self.owners[p] == REPLICATED

    def is_scratch(self, index: int) -> bool:
        """Whether optimizer variable `index` is hvdkeras's bookkeeping, not
        the plain optimizer's state (Note [scratch variables are not state])."""
        return self.layout[index] == SCRATCH

    def add_scratch(self, optimizer: Any, shapes: Sequence[Any], dtypes: Sequence[Any],
                    name: str) -> List[Any]:
        """Adds one zero-initialised optimizer variable per shape, marked as
        scratch (Note [scratch variables are not state]).

        Args:
            optimizer: The built optimizer this state belongs to.
            shapes: The variables' shapes.
            dtypes: Their dtypes.
            name: Their name prefix.

        Returns:
            The new variables, in order (last in `optimizer.variables`).
        """
        added = [optimizer.add_variable(tuple(shape), initializer="zeros", dtype=dtype,
                                        name=f"{name}_{k}")
                 for k, (shape, dtype) in enumerate(zip(shapes, dtypes))]
        if [id(v) for v in optimizer.variables[-len(added):]] != [id(v) for v in added]:
            raise RuntimeError(f"{type(optimizer).__name__}.add_variable did not append to "
                               "its variables; hvdkeras cannot keep its scratch apart.")
        self.layout = self.layout + [SCRATCH] * len(added)
        return added

    def check_layout(self, optimizer: Any) -> None:
        """Raises ValueError when a shared variable is not a scalar: a slot
        this module could not tie to its variable, which would be saved wrong."""
        odd = [v.path for v, p in zip(optimizer.variables, self.layout)
               if p == SHARED and len(v.shape) > 0]
        if odd:
            raise ValueError(
                f"{type(optimizer).__name__} keeps optimizer variables {odd[:3]} that hvdkeras "
                "cannot tie to one model variable (it reads slots from lists indexed like the "
                "variables, as Keras's optimizers keep them), so their state cannot be sharded. "
                "Use zero_stage=0 for this optimizer.")

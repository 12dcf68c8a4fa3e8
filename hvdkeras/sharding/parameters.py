"""What ZeRO stage 3's sharded weights do the same way under every backend:
which variables are sharded and in which gather group, the holdings the
optimizer is built on, and whole values for a block (a rank-0 save or
load). Each backend's subclass moves the tensors: TensorFlow's in
`tf_parameters` (Note [sharded parameters]), torch's in
`hvdkeras/backends/torch/parameters.py` (Note [sharded parameters under
torch]), JAX's in `hvdkeras/backends/jax/parameters.py` (Note [sharded
parameters under JAX]). This module loads no framework.

What may import this module: `hvdkeras.sharding` and `hvdkeras.backends`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence

import keras
import numpy as np

from hvdkeras import compat
from hvdkeras.sharding.plan import REPLICATED
from hvdkeras.sharding.state import ShardState


class ShardedWeights:
    """The rows of the model's weights this rank holds (every backend).

    Args:
        state: The optimizer's shard (its plan is the weights' too).
    """

    def __init__(self, state: ShardState) -> None:
        self.state = state
        self.holdings: Dict[int, keras.Variable] = {}
        self.sharded: List[int] = []
        self.group_of: Dict[int, List[int]] = {}
        self.whole_values: Optional[Dict[int, np.ndarray]] = None

    def make_holdings(self, built_for: List[Any]) -> List[Any]:
        """Plain variables for the rows this rank holds, taken from rank 0's
        current values (so the weights start as rank 0's, as after the usual
        broadcast), one gather group at a time; returns `built_for` with
        them in place of the model variables they hold rows of. Collective."""
        state = self.state
        built_for = list(built_for)
        self.sharded = [p for p in range(len(state.variables))
                        if state.owners[p] != REPLICATED]
        self.group_of = {p: group for group in state.groups for p in group}
        for number, group in enumerate(state.groups):
            for p, holding in zip(group, self._take_rows(number, group)):
                if holding is None:
                    continue
                if p in state.pieces:
                    state.piece_variables[p] = holding
                self.holdings[p] = holding
                built_for[p] = holding
        state.built_for = built_for
        return built_for

    @contextlib.contextmanager
    def gathered_weights(self) -> Iterator[None]:
        """Every sharded weight's whole value on every rank for the block, so
        reads there (a rank-0 save) make no collectives, and a whole value
        assigned there (a rank-0 load) is what later reads in the block see.
        Collective: every rank enters it."""
        if self.whole_values is not None:
            yield
            return
        values: Dict[int, np.ndarray] = {}
        for group in self.state.groups:
            values.update(self._whole_numpy(group))
        self.whole_values = values
        try:
            yield
        finally:
            self.whole_values = None

    def share_whole_from(self, root: int) -> None:
        """Inside `gathered_weights`: every rank takes `root`'s whole values
        (as a rank-0 load left them) and keeps its rows. Collective."""
        for number, group in enumerate(self.state.groups):
            values = self._broadcast_whole(group, root, f"{self.state.name}_from_root_{number}")
            for p, value in zip(group, values):
                self.assign_rows(self.state.variables[p], value)

    def refuse_save_outside_block(self) -> None:
        """Raises if a Keras save reads a sharded weight outside
        `gathered_weights`: the read would be a collective, which a save on
        rank 0 alone (Horovod's checkpoint idiom) would wait on until the
        stall bound; stages 1 and 2 refuse such a save at once too."""
        if self.whole_values is None and compat.inside_keras_save():
            state = self.state
            raise RuntimeError(
                f"The model's weights are sharded across {state.world_size} ranks "
                "(zero_stage=3), so saving must gather them on every rank first; this rank "
                "alone cannot. Save through hvdkeras on every rank: "
                "hvdkeras.callbacks.CheckpointCallback, or "
                "`with hvdkeras.gathered_optimizer_state(model):` around the rank-0 save "
                "(every rank enters the block).")

    def held_elements(self, p: int, rank: int) -> int:
        """How many elements of weight `p` `rank` holds (its rows' worth)."""
        begin, end = self.state.held_rows(p, rank)
        shape = tuple(int(d) for d in self.state.variables[p].shape)
        return (end - begin) * int(np.prod(shape[1:], dtype=np.int64)) if shape else end - begin

    # -- each backend's tensor work ---------------------------------------

    def _take_rows(self, number: int, group: Sequence[int]) -> List[Optional[Any]]:
        """Rank 0's values of gather group `number`, cut to this rank's rows:
        a holding per position, None where this rank holds no rows."""
        raise NotImplementedError("each backend cuts its own tensors")

    def _whole_numpy(self, group: Sequence[int]) -> Dict[int, np.ndarray]:
        """The group's whole values, as NumPy arrays. Collective."""
        raise NotImplementedError("each backend gathers its own tensors")

    def _broadcast_whole(self, group: Sequence[int], root: int, name: str) -> List[Any]:
        """`root`'s `whole_values` of the group, on every rank. Collective."""
        raise NotImplementedError("each backend broadcasts its own tensors")

    def assign_rows(self, variable: Any, value: Any) -> None:
        """Keeps this rank's rows of a whole `value` assigned to `variable`."""
        raise NotImplementedError("each backend writes its own tensors")

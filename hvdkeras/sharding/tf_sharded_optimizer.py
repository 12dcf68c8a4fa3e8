"""The sharded optimizer's tensor work under TensorFlow: sharing the updated
weights from their owners (`exchange`) and sums across the ranks, in the
train step's graph.

What may import this module: `hvdkeras.training` (the TensorFlow backend's
`DistributedOptimizer`).
"""

from __future__ import annotations

from typing import Any, List, Optional

import tensorflow as tf

from hvdkeras.collectives.reduction import grouped_allreduce
from hvdkeras.collectives.sparse import rows_of_slices
from hvdkeras.engine.types import Sum
from hvdkeras.sharding.exchange import broadcast_from_owners
from hvdkeras.sharding.sharded_optimizer import ShardedOptimizerMixin
from hvdkeras.sharding.tf_parameters import ShardedParameters


BUILD_FIRST_MESSAGE = (
    "zero_stage=3 shards the model's weights when the optimizer is built, which must happen "
    "before the first training step is traced. Add "
    "hvdkeras.callbacks.BroadcastGlobalVariablesCallback(0) to fit's callbacks (it builds "
    "the optimizer when training begins), or call "
    "model.optimizer.build(model.trainable_variables) after compile() (every rank).")


class TFShardedMixin(ShardedOptimizerMixin):
    """The sharded optimizer under TensorFlow (at stage 3 with the model's
    weights sharded too: `tf_parameters`)."""

    _hvdkeras_parameters: Optional[ShardedParameters] = None

    def _hvdkeras_before_build(self, built_for: List[Any]) -> List[Any]:
        if self._hvdkeras_parameters is not None and tf.inside_function():
            # Keras builds an optimizer in the first traced step unless
            # something built it before; by then that step has read the
            # weights whole, and its graph would keep reading those copies.
            raise ValueError(BUILD_FIRST_MESSAGE)
        return super()._hvdkeras_before_build(built_for)

    def _hvdkeras_after_update(self) -> None:
        """Shares the updated weights (on update steps, when Keras accumulates)."""
        if self._hvdkeras_parameters is not None:
            return  # stage 3: each rank keeps its rows; steps gather them
        if self.gradient_accumulation_steps and not self.use_ema:
            steps = self.gradient_accumulation_steps
            tf.cond(tf.equal(self._iterations % steps, 0),
                    lambda: self._hvdkeras_share_weights() or tf.constant(True),
                    lambda: tf.constant(True))
        else:
            self._hvdkeras_share_weights()

    def _hvdkeras_share_weights(self) -> None:
        """Gives every rank the values of the variables other ranks own."""
        state = self._hvdkeras_shards
        if state.world_size == 1:
            return
        values, owner_of = state.weight_units(tf.convert_to_tensor)
        received = broadcast_from_owners(values, owner_of, state.rank, state.world_size,
                                         f"{state.name}_weights", state.process_set)
        kept_alive = set()
        for (p, holder), value in received.items():
            if holder >= 0:
                continue  # a piece: the whole variable is put together below
            if state.owners[p] != state.rank:
                state.variables[p].assign(value)
            elif value.dtype not in kept_alive:
                # In a tf.function an op nothing uses is pruned, and the
                # collectives are exempt from running in program order, so
                # each broadcast this rank roots (one per dtype) needs a
                # consumer too: one assignment of an unchanged value.
                state.variables[p].assign(value)
                kept_alive.add(value.dtype)
        for p, pieces in state.pieces.items():
            # Every piece's broadcast, this rank's own included, feeds the assignment.
            state.variables[p].assign(tf.concat([received[(p, piece.rank)] for piece in pieces],
                                                0))

    def _hvdkeras_rows(self, gradient: Any, begin: int, end: int) -> Any:
        """Rows [begin, end) of a dense gradient or of `tf.IndexedSlices`."""
        if not isinstance(gradient, tf.IndexedSlices):
            return gradient[begin:end]
        return rows_of_slices(gradient, begin, end)

    def _hvdkeras_sum_across(self, value: Any, name: str) -> Any:
        """`value` summed over the ranks that share the state."""
        return grouped_allreduce([value], name=name, op=Sum,
                                 process_set=self._hvdkeras_shards.process_set)[0]

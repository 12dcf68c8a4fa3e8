"""The sharded optimizer's tensor work under TensorFlow: sharing the updated
weights from their owners (`exchange`) and sums across the ranks, in the
train step's graph.

What may import this module: `hvdkeras.training` (the TensorFlow backend's
`DistributedOptimizer`).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hvdkeras.collectives.reduction import grouped_allreduce
from hvdkeras.engine.types import Sum
from hvdkeras.sharding.exchange import broadcast_from_owners
from hvdkeras.sharding.plan import REPLICATED
from hvdkeras.sharding.sharded_optimizer import ShardedOptimizerMixin


class TFShardedMixin(ShardedOptimizerMixin):
    """The sharded optimizer under TensorFlow."""

    def _hvdkeras_after_update(self) -> None:
        """Shares the updated weights (on update steps, when Keras accumulates)."""
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
        values = {p: tf.convert_to_tensor(v) for p, v in enumerate(state.variables)
                  if state.owners[p] != REPLICATED}
        received = broadcast_from_owners(values, state.owners, state.rank, state.world_size,
                                         f"{state.name}_weights", state.process_set)
        kept_alive = set()
        for p, value in received.items():
            if state.owners[p] != state.rank:
                state.variables[p].assign(value)
            elif value.dtype not in kept_alive:
                # In a tf.function an op nothing uses is pruned, and the
                # collectives are exempt from running in program order, so
                # each broadcast this rank roots (one per dtype) needs a
                # consumer too: one assignment of an unchanged value.
                state.variables[p].assign(value)
                kept_alive.add(value.dtype)

    def _hvdkeras_sum_across(self, value: Any, name: str) -> Any:
        """`value` summed over the ranks that share the state."""
        return grouped_allreduce([value], name=name, op=Sum,
                                 process_set=self._hvdkeras_shards.process_set)[0]

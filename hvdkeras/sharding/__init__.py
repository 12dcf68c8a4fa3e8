"""Sharded optimizer state, gradients and weights (ZeRO stages 1 to 3) for
Keras 3 optimizers.

`hvdkeras.DistributedOptimizer(optimizer, zero_stage=1|2|3)` is the way in;
`docs/memory-scaling.md` explains the stages. The pieces: `plan` (which rank
owns which variable: pure), `checks` (what the settings must allow),
`state` (the shard and its slot layout), `exchange` (TensorFlow's step
collectives), `sharded_optimizer` (the optimizer class, for every backend,
with no framework in it), `tf_sharded_optimizer` (its tensor work under
TensorFlow; torch and JAX add theirs in `hvdkeras.backends`),
`tf_parameters` (stage 3's sharded weights, TensorFlow) and
`state_transfer` (checkpoints, through `hvdkeras.host`).

What may import it: `hvdkeras.training`, `hvdkeras.backends`, `hvdkeras.callbacks`
and the top-level package. It imports `hvdkeras.collectives`, `hvdkeras.engine`,
`hvdkeras.host` and `hvdkeras.compat`.
"""

from hvdkeras.sharding.plan import REPLICATED, plan_blocks, plan_owners, shard_bytes

__all__ = ["REPLICATED", "plan_blocks", "plan_owners", "shard_bytes"]

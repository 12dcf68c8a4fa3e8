"""Sharded optimizer state (ZeRO stages 1 and 2) for Keras 3 optimizers.

`hvdkeras.DistributedOptimizer(optimizer, zero_stage=1|2)` is the way in;
`docs/memory-scaling.md` explains the stages. The pieces: `plan` (which rank
owns which variable: pure), `checks` (what the settings must allow),
`state` (the shard and its slot layout), `exchange` (TensorFlow's step
collectives), `sharded_optimizer` (the optimizer class, for every backend;
torch and JAX add their tensor work in `hvdkeras.backends`) and
`state_transfer` (checkpoints).

What may import it: `hvdkeras.training`, `hvdkeras.backends`, `hvdkeras.callbacks`
and the top-level package. It imports `hvdkeras.collectives`, `hvdkeras.engine` and
`hvdkeras.compat`.
"""

from hvdkeras.sharding.plan import REPLICATED, plan_blocks, plan_owners, shard_bytes

__all__ = ["REPLICATED", "plan_blocks", "plan_owners", "shard_bytes"]

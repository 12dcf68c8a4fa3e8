"""Collective operations on TensorFlow tensors, eager and inside `tf.function`.

* `common`: reductions, names (see Note [collective names]), type checks.
* `kernels`: the one place that calls the op library's generated wrappers.
* `reduction` (allreduce), `broadcasting`, `gather_scatter` (allgather,
  alltoall, reducescatter), `sparse` (`tf.IndexedSlices`), `objects`
  (picklable Python objects), `synchronization` (barrier, join), `compression`
  (wire casts for reductions),
  `world_ops` (`size_op`, `rank_op`, ...: the world as tensors).
* `gradients`: their registered gradients (imported here, so every use of a
  collective has them).

What may import it: `hvdkeras.training`, `hvdkeras.callbacks`, the recipes'
training code and the top-level package. It imports `hvdkeras.engine`.
"""

from hvdkeras.collectives import gradients  # noqa: F401  (registers the gradients)
from hvdkeras.collectives.broadcasting import (broadcast, broadcast_, broadcast_global_variables,
                                               broadcast_variables)
from hvdkeras.collectives.gather_scatter import (allgather, alltoall, grouped_allgather,
                                                 grouped_reducescatter, reducescatter)
from hvdkeras.collectives.objects import allgather_object, broadcast_object
from hvdkeras.collectives.reduction import allreduce, grouped_allreduce
from hvdkeras.collectives.synchronization import barrier, join
from hvdkeras.collectives.world_ops import (cross_rank_op, cross_size_op, local_rank_op,
                                            local_size_op, rank_op, size_op)
from hvdkeras.engine.types import Average, Max, Min, Product, Sum

__all__ = [
    "Average", "Max", "Min", "Product", "Sum", "allgather", "allgather_object", "allreduce",
    "alltoall", "barrier", "broadcast", "broadcast_", "broadcast_global_variables",
    "broadcast_object", "broadcast_variables",
    "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "join", "reducescatter",
    "size_op", "rank_op", "local_size_op", "local_rank_op", "cross_size_op", "cross_rank_op",
]

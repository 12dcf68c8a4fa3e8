"""Collective operations on TensorFlow tensors, eager and inside `tf.function`.

* `common`: reductions, names (see Note [collective names]), type checks.
* `kernels`: the one place that calls the op library's generated wrappers.
* `reduction` (allreduce), `broadcasting`, `gather_scatter` (allgather,
  alltoall, reducescatter), `sparse` (`tf.IndexedSlices`), `objects`
  (picklable Python objects), `synchronization` (barrier, join), `compression`
  (wire casts for reductions),
  `world_ops` (`size_op`, `rank_op`, ...: the world as tensors).
* `gradients`: their registered gradients (imported by every module that
  makes an op with a gradient, so every use of a collective has them).

The names below are loaded on first use (PEP 562), so that importing a
module of this package that needs no TensorFlow (`compression`) loads none.

What may import it: `hvdkeras.training`, `hvdkeras.callbacks`, the recipes'
training code and the top-level package. It imports `hvdkeras.engine`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

_DEFINED_IN: Dict[str, str] = {
    **dict.fromkeys(("broadcast", "broadcast_", "broadcast_global_variables",
                     "broadcast_variables"), "broadcasting"),
    **dict.fromkeys(("allgather", "alltoall", "grouped_allgather", "grouped_reducescatter",
                     "reducescatter"), "gather_scatter"),
    **dict.fromkeys(("allgather_object", "broadcast_object"), "objects"),
    **dict.fromkeys(("allreduce", "grouped_allreduce"), "reduction"),
    **dict.fromkeys(("barrier", "join"), "synchronization"),
    **dict.fromkeys(("cross_rank_op", "cross_size_op", "local_rank_op", "local_size_op",
                     "rank_op", "size_op"), "world_ops"),
}
_REDUCTIONS = ("Average", "Max", "Min", "Product", "Sum")

__all__: List[str] = sorted([*_DEFINED_IN, *_REDUCTIONS])


def __getattr__(name: str) -> Any:
    if name in _DEFINED_IN:
        value = getattr(importlib.import_module(f"{__name__}.{_DEFINED_IN[name]}"), name)
    elif name in _REDUCTIONS:
        value = getattr(importlib.import_module("hvdkeras.engine.types"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what static analysers see; nothing runs
    from hvdkeras.collectives.broadcasting import (broadcast, broadcast_,
                                                   broadcast_global_variables,
                                                   broadcast_variables)
    from hvdkeras.collectives.gather_scatter import (allgather, alltoall, grouped_allgather,
                                                     grouped_reducescatter, reducescatter)
    from hvdkeras.collectives.objects import allgather_object, broadcast_object
    from hvdkeras.collectives.reduction import allreduce, grouped_allreduce
    from hvdkeras.collectives.synchronization import barrier, join
    from hvdkeras.collectives.world_ops import (cross_rank_op, cross_size_op, local_rank_op,
                                                local_size_op, rank_op, size_op)
    from hvdkeras.engine.types import Average, Max, Min, Product, Sum

"""Which public names a Keras backend defines itself.

The facade (`hvdkeras/__init__.py`) looks a name up here first: under a
backend listed below, `hvdkeras.<name>` is that backend's version (the same
arguments, its own tensors); every other name, and every name under
TensorFlow, comes from the modules the facade lists (some of which dispatch
themselves: `DistributedOptimizer` in `hvdkeras.training.optimizer`, which
every caller reaches, recipes included). Importing it loads no framework.

What may import this module: the facade and the rest of `hvdkeras.backends`.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict

from hvdkeras.engine import frameworks

_COLLECTIVES = ("allreduce", "grouped_allreduce", "broadcast", "allgather", "reducescatter",
                "barrier")
_SHARED = {"broadcast_variables": "hvdkeras.backends.variables",
           "broadcast_object": "hvdkeras.host.objects",
           "allgather_object": "hvdkeras.host.objects",
           "join": "hvdkeras.host.synchronization",
           "grouped_allgather": "hvdkeras.backends.grouped",
           "grouped_reducescatter": "hvdkeras.backends.grouped"}

BACKEND_PUBLIC: Dict[str, Dict[str, str]] = {
    "torch": {
        **dict.fromkeys(_COLLECTIVES + ("broadcast_", "alltoall"),
                        "hvdkeras.backends.torch.collectives"),
        **_SHARED,
    },
    "jax": {
        **dict.fromkeys(_COLLECTIVES + ("alltoall",), "hvdkeras.backends.jax.collectives"),
        **_SHARED,
    },
}

#: Every name some backend defines itself.
DISPATCHED = frozenset(name for table in BACKEND_PUBLIC.values() for name in table)


def module_for(name: str, backend: str, default: str) -> str:
    """The module that defines public `name` under `backend`."""
    return BACKEND_PUBLIC.get(backend, {}).get(name, default)


def backend_function(name: str) -> Callable[..., Any]:
    """The running Keras backend's own collective `name` (torch or jax: where
    the table above says it lives); its module is imported on first use."""
    backend = frameworks.keras_backend()
    try:
        module = BACKEND_PUBLIC[backend][name]
    except KeyError:
        raise RuntimeError(f"hvdkeras has no {name!r} of its own under the {backend} "
                           "backend.") from None
    return getattr(importlib.import_module(module), name)

"""Loads the compiled libraries (building them first when needed).

The engine is a library of its own (Note [one engine, many bindings] in
`toolchain.py`). Under TensorFlow the op library is loaded with
`tf.load_op_library` and brings the engine with it; its ctypes handle also
reaches the engine's C entry points (typed in `hvdkeras.engine.c_api`).
Other backends load the engine library alone (`engine_handle`), without
TensorFlow's runtime. Either way one process holds one engine.

What may import this module: the rest of `hvdkeras.engine`, and
`hvdkeras.collectives.kernels` (the one place that calls the op wrappers).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, Optional

from hvdkeras import compat
from hvdkeras.engine import build, c_api, cuda_build, toolchain, types

_lock = threading.Lock()
_ops_module: Any = None
_cdll: Optional[ctypes.CDLL] = None
_path: Optional[Path] = None
_engine_cdll: Optional[ctypes.CDLL] = None

# Note [stateful but unordered]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Ops that talk to other ranks are registered stateful (op_definitions.cc),
# so TensorFlow never constant-folds or deduplicates them: a folded
# collective would run once at optimisation time on one rank only. Unlike
# other stateful ops they must not be chained in program order by
# tf.function's automatic control dependencies: ranks may create them in
# different orders, and the engine negotiates the order. TensorFlow's own
# collective ops are exempted the same way (compat.exempt_from_program_order).
# They must still run when a rank ignores their results (as in Horovod):
# otherwise that rank alone would prune them and the others would wait for it.
# The two halves of a pending reduction (Note [pending reductions] in
# ops/tf/pending_reductions.cc) are exempt too: the start is a collective,
# and the done waits for one.
COLLECTIVE_OP_TYPES = frozenset(("HvdkerasAllreduce", "HvdkerasBroadcast", "HvdkerasAllgather",
                                 "HvdkerasReducescatter", "HvdkerasAlltoall",
                                 "HvdkerasAllreduceStart", "HvdkerasAllreduceDone"))


def _configured(cdll: ctypes.CDLL) -> ctypes.CDLL:
    # Where a GPU build finds the CUDA runtime, NVRTC and NCCL when
    # TensorFlow has not loaded them already: the NVIDIA wheels.
    dirs = ":".join(str(d) for d in cuda_build.wheel_dirs("lib"))
    cdll.hvdkeras_gpu_set_library_dirs(dirs.encode())
    # Compiled GPU kernels are kept beside the op libraries.
    cdll.hvdkeras_gpu_set_kernel_cache_dir(str(toolchain.cache_root() / "kernels").encode())
    return cdll


def load() -> tuple[Any, ctypes.CDLL]:
    """Returns (TensorFlow op module, ctypes handle), building on first use."""
    global _ops_module, _cdll, _path
    with _lock:
        if _ops_module is None:
            import tensorflow as tf  # lazy: seconds to import; `import hvdkeras` stays light

            path = build.ensure_built()
            _ops_module = tf.load_op_library(str(path))
            compat.exempt_from_program_order(COLLECTIVE_OP_TYPES)
            _cdll = _configured(c_api.bind(ctypes.CDLL(str(path))))
            _path = path
        return _ops_module, _cdll


def engine_handle() -> ctypes.CDLL:
    """The engine's C entry points without the TensorFlow binding (for the other
    backends); the TensorFlow handle when that is loaded already."""
    global _engine_cdll
    with _lock:
        if _cdll is not None:
            return _cdll
        if _engine_cdll is None:
            path = build.ensure_engine_built()
            _engine_cdll = _configured(c_api.bind(ctypes.CDLL(str(path))))
        return _engine_cdll


def ops() -> Any:
    """The TensorFlow op module (generated Python wrappers of the kernels)."""
    return load()[0]


def handle() -> ctypes.CDLL:
    """The engine's C entry points (see `hvdkeras.engine.c_api`)."""
    return load()[1]


def library_path() -> Optional[Path]:
    """Path of the loaded library, or None when not loaded yet."""
    return _path


_vocabulary: Optional[types.Vocabulary] = None


def vocabulary() -> types.Vocabulary:
    """The loaded library's element types and reductions (loads it if needed)."""
    global _vocabulary
    if _vocabulary is None:
        _vocabulary = types.parse_vocabulary(engine_handle().hvdkeras_vocabulary().decode())
    return _vocabulary

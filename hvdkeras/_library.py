"""Loads the compiled op library (building it first when needed).

The same shared object serves TensorFlow (its op kernels, through
`tf.load_op_library`) and Python (the engine's C entry points, through
ctypes); both handles refer to one loaded copy, so they share the engine.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any, Optional

_lock = threading.Lock()
_ops_module: Any = None
_cdll: Optional[ctypes.CDLL] = None
_path: Optional[Path] = None


def _bind_c_api(lib: ctypes.CDLL) -> None:
    lib.hvdkeras_engine_start.argtypes = [
        ctypes.c_int,  # Fortran handle of the communicator
        ctypes.c_int64,  # fusion threshold
        ctypes.c_double,  # cycle time (ms)
        ctypes.c_int,  # cache capacity
        ctypes.c_double,  # stall check seconds
        ctypes.c_double,  # stall shutdown seconds
        ctypes.c_char_p,  # timeline path
        ctypes.c_int,  # timeline: mark cycles
        ctypes.c_int,  # autotune
        ctypes.c_int,  # autotune: threshold fixed
        ctypes.c_int,  # autotune: cycle time fixed
        ctypes.c_char_p,  # autotune log
        ctypes.c_int64,  # allreduce chunk bytes
        ctypes.c_int,  # shared-memory allreduce
        ctypes.c_char_p,  # error buffer
        ctypes.c_int,  # its capacity
    ]
    lib.hvdkeras_engine_start.restype = ctypes.c_int
    lib.hvdkeras_engine_stop.argtypes = []
    lib.hvdkeras_engine_stop.restype = None
    lib.hvdkeras_engine_running.argtypes = []
    lib.hvdkeras_engine_running.restype = ctypes.c_int
    lib.hvdkeras_set_timeline.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.hvdkeras_set_timeline.restype = None
    lib.hvdkeras_current_params.argtypes = [ctypes.POINTER(ctypes.c_int64),
                                            ctypes.POINTER(ctypes.c_double)]
    lib.hvdkeras_current_params.restype = None
    lib.hvdkeras_build_flavor.argtypes = []
    lib.hvdkeras_build_flavor.restype = ctypes.c_char_p


# Ops that talk to other ranks. They are stateful, so TensorFlow never
# constant-folds or deduplicates them (a folded collective would run once at
# optimisation time on one rank only), but unlike other stateful ops they must
# not be chained in program order by tf.function's automatic control
# dependencies: ranks may create them in different orders, and the engine
# negotiates the order. TensorFlow's own collective ops are exempted the same
# way.
COLLECTIVE_OP_TYPES = frozenset(("HvdkerasAllreduce", "HvdkerasBroadcast", "HvdkerasAllgather",
                                 "HvdkerasReducescatter", "HvdkerasAlltoall"))


def _exempt_from_program_order() -> None:
    import warnings

    try:
        from tensorflow.python.framework import auto_control_deps
    except ImportError:  # pragma: no cover - depends on the TF version
        auto_control_deps = None
    if auto_control_deps is None or not hasattr(auto_control_deps, "ASYNC_STATEFUL_OPS"):
        warnings.warn("hvdkeras could not exempt its collectives from tf.function's automatic "
                      "control dependencies in this TensorFlow version; collectives inside one "
                      "tf.function will run in program order.")
        return
    auto_control_deps.ASYNC_STATEFUL_OPS = (
        frozenset(auto_control_deps.ASYNC_STATEFUL_OPS) | COLLECTIVE_OP_TYPES)


def load() -> tuple[Any, ctypes.CDLL]:
    """Returns (TensorFlow op module, ctypes handle), building on first use."""
    global _ops_module, _cdll, _path
    with _lock:
        if _ops_module is None:
            import tensorflow as tf

            from hvdkeras import _build

            path = _build.ensure_built()
            _ops_module = tf.load_op_library(str(path))
            _exempt_from_program_order()
            _cdll = ctypes.CDLL(str(path))
            _bind_c_api(_cdll)
            _path = path
        return _ops_module, _cdll


def ops() -> Any:
    """The TensorFlow op module (generated Python wrappers of the kernels)."""
    return load()[0]


def c_api() -> ctypes.CDLL:
    """The engine's C entry points."""
    return load()[1]


def library_path() -> Optional[Path]:
    """Path of the loaded library, or None when not loaded yet."""
    return _path

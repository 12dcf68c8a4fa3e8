"""The collectives inside XLA-compiled functions, as XLA custom calls.

See Note [xla collectives] in ops/tf/xla_custom_calls.cc: inside
`tf.function(jit_compile=True)` the wrappers emit TensorFlow's
XlaCustomCallV2 op, which XLA compiles into a call of the op library's
target; the call's description is the text written here and parsed there.
Allreduce and broadcast (static shapes) are supported; the collectives whose
output shape depends on other ranks are not.

What may import this module: `hvdkeras.collectives.kernels`.
"""

from __future__ import annotations

import functools
from typing import List

import tensorflow as tf

from hvdkeras import compat
from hvdkeras.engine import library

XLA_UNSUPPORTED = (
    "hvdkeras.{what} has no XLA form: its output's shape depends on the other ranks. "
    "Call it outside the jit_compile=True function (or compile that function without XLA)."
)


@functools.lru_cache(maxsize=None)
def supported() -> bool:
    """Whether the op library registered its XLA custom-call targets."""
    return bool(library.handle().hvdkeras_xla_calls_built())


def usable() -> bool:
    """Whether a train step may be XLA-compiled here: the targets exist and run
    on the host, so not where TensorFlow places the step on a GPU."""
    return supported() and not tf.config.list_logical_devices("GPU")


def _engine_dtype(dtype: tf.DType) -> int:
    for entry in library.vocabulary().dtypes:
        if entry.name == dtype.name:
            return entry.value
    raise TypeError(f"hvdkeras collectives do not support {dtype.name} tensors.")


def _describe(name: str, tensors: List[tf.Tensor], **fields) -> str:
    """The call's description (see Note [xla collectives] for the format)."""
    lines = [f"name={name}", f"dtype={_engine_dtype(tensors[0].dtype)}"]
    lines += [f"{key}={value!r}" if isinstance(value, float) else f"{key}={value}"
              for key, value in fields.items()]
    for t in tensors:
        if not t.shape.is_fully_defined():
            raise ValueError(f"hvdkeras collectives under XLA need static shapes; '{name}' got "
                             f"{t.shape}.")
        lines.append("shape=" + ",".join(str(d) for d in t.shape.as_list()))
    return "\n".join(lines)


def _call_name(graph_name: str) -> str:
    """A name unique in the function being traced, the same on every rank."""
    return tf.compat.v1.get_default_graph().unique_name(f"xla/{graph_name}")


def allreduce(tensors: List[tf.Tensor], op: int, prescale_factor: float,
              postscale_factor: float, graph_name: str, process_set_id: int) -> List[tf.Tensor]:
    config = _describe(_call_name(graph_name), tensors, reduce_op=op,
                       prescale=float(prescale_factor), postscale=float(postscale_factor),
                       process_set=process_set_id)
    return compat.xla_custom_call(tensors, "hvdkeras_allreduce", config,
                                  [t.dtype for t in tensors], [t.shape for t in tensors])


def broadcast(tensors: List[tf.Tensor], root_rank: int, graph_name: str,
              process_set_id: int) -> List[tf.Tensor]:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:  # one call per dtype: the description has one dtype
        out: List = [None] * len(tensors)
        for dtype in dtypes:
            at = [i for i, t in enumerate(tensors) if t.dtype == dtype]
            for i, r in zip(at, broadcast([tensors[i] for i in at], root_rank,
                                          f"{graph_name}_{dtype.name}", process_set_id)):
                out[i] = r
        return out
    config = _describe(_call_name(graph_name), tensors, root_rank=root_rank,
                       process_set=process_set_id)
    return compat.xla_custom_call(tensors, "hvdkeras_broadcast", config,
                                  [t.dtype for t in tensors], [t.shape for t in tensors])

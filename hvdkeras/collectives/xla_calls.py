"""The collectives inside XLA-compiled functions, as XLA custom calls.

See Note [xla collectives] in ops/tf/xla_custom_calls.cc: inside
`tf.function(jit_compile=True)` the wrappers emit TensorFlow's
XlaCustomCallV2 op, which XLA compiles into a call of the op library's
target; the call's description is the text written here and parsed there.
Allreduce and broadcast (static shapes) are supported; the collectives whose
output shape depends on other ranks are not.

What may import this module: `hvdkeras.collectives.kernels`, and
`hvdkeras.training` for `steps_on_gpu`.
"""

from __future__ import annotations

import functools
import os
from typing import List, Mapping, Optional

import tensorflow as tf

from hvdkeras import compat
from hvdkeras.engine import library
from hvdkeras.engine.config import parse_bool

# Opts in to the collectives under XLA on GPUs (the CUDA custom-call targets).
XLA_GPU = "HVDKERAS_XLA_GPU"

XLA_UNSUPPORTED = (
    "hvdkeras.{what} has no XLA form: its output's shape depends on the other ranks. "
    "Call it outside the jit_compile=True function (or compile that function without XLA)."
)


@functools.lru_cache(maxsize=None)
def supported() -> bool:
    """Whether the op library registered its XLA custom-call targets."""
    return bool(library.handle().hvdkeras_xla_calls_built())


@functools.lru_cache(maxsize=None)
def gpu_supported() -> bool:
    """Whether the op library registered the targets for GPUs too."""
    return bool(library.handle().hvdkeras_xla_gpu_calls_built())


def gpu_opted_in(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether `HVDKERAS_XLA_GPU` asks for the collectives under XLA on GPUs."""
    return parse_bool(os.environ if env is None else env, XLA_GPU)


def refusal_reason(targets: bool, gpu_targets: bool, on_gpu: bool, opted_in: bool) -> str:
    """Why a train step may not be XLA-compiled with hvdkeras collectives ("" if it may).

    Pure: the facts are arguments. On GPUs the targets are opt-in
    (`HVDKERAS_XLA_GPU=1`) until they have run on a GPU in this project's tests.

    Example:

    ```python
    refusal_reason(targets=True, gpu_targets=True, on_gpu=False, opted_in=False)  # ""
    ```
    """
    if not targets:
        return "this op library was built without XLA's custom-call headers"
    if not on_gpu:
        return ""
    if not gpu_targets:
        return "this op library has no GPU part, so its collectives have no XLA form on a GPU"
    if not opted_in:
        return (f"hvdkeras collectives under XLA on a GPU are opt-in until verified on GPUs "
                f"(set {XLA_GPU}=1 to use them)")
    return ""


def steps_on_gpu() -> bool:
    """Whether TensorFlow runs this rank's steps on a GPU: it places ops on a
    visible GPU by default. Sets up TensorFlow's devices if nothing has yet."""
    return bool(tf.config.list_logical_devices("GPU"))


def refusal() -> str:
    """`refusal_reason` for this process."""
    if not supported():
        return refusal_reason(False, False, False, False)
    on_gpu = steps_on_gpu()
    return refusal_reason(True, on_gpu and gpu_supported(), on_gpu, gpu_opted_in())


def usable() -> bool:
    """Whether a train step may be XLA-compiled here (see `refusal_reason`)."""
    return not refusal()


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

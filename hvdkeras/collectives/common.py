"""What the collective wrappers share: reductions, names, type checks, grouping.

Note [collective names]
~~~~~~~~~~~~~~~~~~~~~~~
Ranks match collectives by name, so every rank must give the same call the
same name. Inside a `tf.function` a wrapper passes an empty `tensor_name`
and the kernel uses its graph node's name (ops/tf/kernels.cc,
CollectiveKernel), which TensorFlow derives from `name=` and keeps unique
per graph; ops may then run in any order on each rank, and the engine
negotiates. Eagerly a wrapper passes `name` itself or a fixed default per
kind of collective: eager ops run one after another in program order, so
repeating a default is safe. The collectives in a gradient are named after
the forward op ("<name>_grad", `grad_name`) so the backward passes match too.
Node names match across ranks only while the ranks trace the same graph.
A sharded optimizer's step differs per rank by design (each rank updates
its own variables), and a node inlined from a `tf.cond` branch is named by
its position in the branch, so there the wrappers run under
`fixed_collective_names()`: the engine name is `name`, as eagerly, and the
caller keeps each name unique within a step.

What may import this module: the rest of `hvdkeras.collectives`, and
`hvdkeras.training` for `scale_values`.
"""

from __future__ import annotations

import contextlib
import re
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import tensorflow as tf

from hvdkeras.engine import library
from hvdkeras.engine.types import ALL_REDUCE_OP_NAMES, Average, Sum

# What the collectives accept as a tensor: tensors, variables, NumPy arrays
# and Python numbers (converted with tf.convert_to_tensor).
TensorLike = tf.types.experimental.TensorLike

_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\-/]")

# Autograph need not rewrite the wrappers when they are called inside a
# tf.function (it made tracing a step with hundreds of collectives ~6x slower).
not_converted = tf.autograph.experimental.do_not_convert


def resolve_op(op: Optional[int], average: Optional[bool]) -> int:
    """The reduction from `op=` or Horovod's older `average=` (default Average)."""
    if op is not None and average is not None:
        raise ValueError("Pass either op= or the older average=, not both.")
    if average is not None:
        op = Average if average else Sum
    if op is None:
        op = Average
    if op not in ALL_REDUCE_OP_NAMES:
        raise ValueError(
            f"Unknown reduction op {op!r}: use hvdkeras.Sum, Average, Min, Max, Product or "
            "Adasum."
        )
    return op


def op_name(name: Optional[str], default: str) -> str:
    """A valid TensorFlow op name for `name` (TF restricts the characters)."""
    if not name:
        return default
    cleaned = _INVALID_NAME_CHARS.sub("_", name)
    return cleaned if cleaned[0].isalnum() or cleaned[0] == "." else "t" + cleaned


_fixed = threading.local()


@contextlib.contextmanager
def fixed_collective_names() -> Iterator[None]:
    """Collectives built inside use their given names as engine names, in
    graphs too (Note [collective names])."""
    before = getattr(_fixed, "on", False)
    _fixed.on = True
    try:
        yield
    finally:
        _fixed.on = before


def names(name: Optional[str], default: str) -> Tuple[str, str]:
    """(graph op name, engine tensor name) for one collective call.

    See Note [collective names]: eagerly (or under `fixed_collective_names`)
    the engine name is explicit; in a graph it is left empty so the kernel
    uses the node name.
    """
    graph_name = op_name(name, default)
    if tf.executing_eagerly() or getattr(_fixed, "on", False):
        return graph_name, name or default
    return graph_name, ""


def grad_name(op, default: Optional[str] = None, suffix: str = "grad") -> Optional[str]:
    """Name for a collective in the gradient of `op`: "<its name>_<suffix>"."""
    try:
        tensor_name = op.get_attr("tensor_name")
        if isinstance(tensor_name, bytes):
            tensor_name = tensor_name.decode()
    except (ValueError, TypeError):
        tensor_name = ""
    return f"{tensor_name}_{suffix}" if tensor_name else default


def check_dtype(tensor: tf.Tensor, what: str, reducing: bool) -> None:
    """Refuses a type the engine does not reduce (`reducing`) or move.

    The accepted types come from the library's table (see Note [wire
    vocabulary] in ops/core/types.def).
    """
    vocabulary = library.vocabulary()
    allowed = vocabulary.reducible_names if reducing else vocabulary.movable_names
    if tensor.dtype.name not in allowed:
        raise TypeError(f"hvdkeras.{what} does not support dtype {tensor.dtype.name}; "
                        f"supported: {', '.join(allowed)}.")


def to_tensors(tensors: Sequence, what: str, reducing: bool, min_rank: int = 0
               ) -> List[tf.Tensor]:
    """Converts to tensors and checks each one's type and rank."""
    converted = [tf.convert_to_tensor(t) for t in tensors]
    for t in converted:
        check_dtype(t, what, reducing)
        if min_rank and t.shape.rank == 0:
            raise ValueError(f"hvdkeras.{what} needs tensors with at least one dimension; "
                             "reshape scalars to [1] first.")
    return converted


def per_dtype(tensors: Sequence[tf.Tensor], base: str,
              collective: Callable[[List[tf.Tensor], str], List[tf.Tensor]]
              ) -> List[tf.Tensor]:
    """Runs `collective(group, name)` once per dtype present, in order of first
    appearance (names `base`, `base_1`, ...), and returns the outputs in the
    order of `tensors`: the grouped collectives fuse one dtype per buffer."""
    groups: Dict[tf.DType, List[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    results: List[Optional[tf.Tensor]] = [None] * len(tensors)
    for number, indices in enumerate(groups.values()):
        name = base if number == 0 else f"{base}_{number}"
        for i, out in zip(indices, collective([tensors[i] for i in indices], name)):
            results[i] = out
    return results  # type: ignore[return-value]


def scale_values(values: tf.Tensor, scale: float) -> tf.Tensor:
    """`values * scale` with the factor exact in `values`' own dtype."""
    if scale == 1.0:
        return values
    return values * tf.cast(tf.constant(scale, tf.float64), values.dtype)

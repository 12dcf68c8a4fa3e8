"""Adasum under the torch and JAX backends.

The same arithmetic as TensorFlow's (`hvdkeras/collectives/adasum.py`), in
`keras.ops` so one version serves both backends: every rank's tensors are
gathered with the backend's allgather and combined pairwise, neighbours
first, in float64 (float32 under JAX unless `jax_enable_x64` is on), so all
ranks compute the same result from the same arithmetic. Usable eagerly and
inside `jax.jit` or `torch.compile` (the shapes are the same on every rank).

What may import this module: the torch and jax collectives.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence

import keras
from keras import ops

from hvdkeras.engine import frameworks


def _wide_dtype() -> str:
    if frameworks.keras_backend() == "jax":
        import jax  # lazy: an optional extra, present when the backend is jax

        if not jax.config.jax_enable_x64:
            return "float32"
    return "float64"


def combine(a: Any, b: Any) -> Any:
    """The Adasum of two tensors (a zero tensor leaves the other as is)."""
    dot = ops.sum(a * b)
    a_norm = ops.sum(a * a)
    b_norm = ops.sum(b * b)
    one = ops.ones_like(dot)
    # (Keras's torch `maximum` with a Python float returns float32: divide by
    # the norm itself, or by one where it is zero.)
    a_coef = ops.where(a_norm > 0, one - dot / (2.0 * ops.where(a_norm > 0, a_norm, one)), one)
    b_coef = ops.where(b_norm > 0, one - dot / (2.0 * ops.where(b_norm > 0, b_norm, one)), one)
    return a_coef * a + b_coef * b


def tree(values: Sequence[Any]) -> Any:
    """Combines values pairwise, neighbours first, up to one."""
    level = list(values)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])
        level = paired
    return level[0]


def adasum(tensors: Sequence[Any], gather: Callable[[Any, str], Any], name: str,
           size: int, prescale: float = 1.0, postscale: float = 1.0) -> List[Any]:
    """The Adasum over the ranks of each tensor.

    Args:
        tensors: Floating tensors, the same shapes on every rank.
        gather: The backend's allgather: (tensor, name) -> rows of all ranks.
        name: The name every rank gives this call.
        size: How many ranks take part.
        prescale: Multiplies each rank's tensors first.
        postscale: Multiplies the results.

    Returns:
        The combined tensors, in the inputs' dtypes.
    """
    wide = _wide_dtype()
    out = []
    for index, tensor in enumerate(tensors):
        dtype = keras.backend.standardize_dtype(tensor.dtype)
        if "float" not in dtype:
            raise ValueError(f"hvdkeras.Adasum combines floating-point tensors; got {dtype}.")
        rows = gather(ops.expand_dims(tensor * prescale if prescale != 1.0 else tensor, 0),
                      f"{name}.{index}")
        rows = ops.cast(rows, wide)
        combined = tree([rows[r] for r in range(size)])
        if postscale != 1.0:
            combined = combined * postscale
        out.append(ops.cast(combined, dtype))
    return out

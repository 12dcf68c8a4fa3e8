"""Grouped allgather and reducescatter under the backends that define their
own collectives (torch, jax), one definition for both.

A group is one collective per tensor, part i named `<name>.<i>` on every
rank, so the names agree wherever the ranks make the same call. Under
`jax.jit` the parts are in flight together and the engine fuses the ones
that meet in a cycle; eagerly each part finishes before the next starts.

What may import this module: the facade's dispatch (`dispatch.py` names it).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from hvdkeras.backends import dispatch
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Average


def _each_part(call: Callable[..., Any], tensors: Sequence[Any], name: Optional[str],
               default_name: str, *args: Any) -> List[Any]:
    base = name or default_name
    return [call(tensor, f"{base}.{i}", *args) for i, tensor in enumerate(tensors)]


def grouped_allgather(tensors: Sequence[Any], name: Optional[str] = None,
                      process_set: ProcessSet = global_process_set) -> List[Any]:
    """`allgather` of each tensor in a list (torch tensors or JAX arrays).

    Args:
        tensors: What to gather, each along its first dimension (rows may
            differ per rank, except inside `jax.jit`).
        name: The name every rank gives this call (part i is `name.i`).
        process_set: The ranks taking part (default all).

    Returns:
        The gathered tensors, in input order.

    Example:

    ```python
    a, b = hvd.grouped_allgather([keras.ops.ones((2, 3)), keras.ops.zeros((1,))])
    ```
    """
    return _each_part(dispatch.backend_function("allgather"), tensors, name,
                      "HvdkerasGroupedAllgather", process_set)


def grouped_reducescatter(tensors: Sequence[Any], name: Optional[str] = None,
                          op: int = Average, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0,
                          process_set: ProcessSet = global_process_set) -> List[Any]:
    """`reducescatter` of each tensor in a list (torch tensors or JAX arrays).

    Args:
        tensors: What to reduce, each at least 1-D, the same shapes on every rank.
        name: The name every rank gives this call (part i is `name.i`).
        op: `hvdkeras.Average` (default) or `hvdkeras.Sum`.
        prescale_factor: Multiplies the inputs before the reduction.
        postscale_factor: Multiplies the results after it.
        process_set: The ranks taking part (default all).

    Returns:
        This rank's rows of each reduced tensor, in input order.

    Example:

    ```python
    a, b = hvd.grouped_reducescatter([keras.ops.ones((4,)), keras.ops.ones((6, 2))],
                                     op=hvd.Sum)
    ```
    """
    return _each_part(dispatch.backend_function("reducescatter"), tensors, name,
                      "HvdkerasGroupedReducescatter", op, prescale_factor, postscale_factor,
                      process_set)

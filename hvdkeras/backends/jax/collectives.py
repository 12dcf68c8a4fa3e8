"""hvdkeras's collectives on JAX arrays, under Horovod's names and arguments
(the same as the TensorFlow functions in `hvdkeras.collectives`), usable
eagerly and inside `jax.jit`.

What may import this module: the rest of `hvdkeras.backends`, the facade's dispatch.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from hvdkeras.backends import adasum
from hvdkeras.backends.jax import ops
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Adasum, Average, Sum
from hvdkeras.host import arrays, buffers

def _set_id(process_set: ProcessSet) -> int:
    return process_sets.view(process_set).set_id


def _compress(array, compression: Any):
    # The compressor names its wire dtype (hvdkeras.collectives.compression).
    name = getattr(compression, "wire_dtype", None)
    wire = None if name is None else jnp.dtype(name)
    if wire is not None and jnp.issubdtype(array.dtype, jnp.floating) and array.dtype != wire:
        return array.astype(wire)
    return array


def _adasum(tensors: Sequence[Any], name: Optional[str], prescale: float, postscale: float,
            compression: Any, process_set: ProcessSet) -> List[jax.Array]:
    originals = [jnp.asarray(t) for t in tensors]
    wires = [_compress(t, compression) for t in originals]
    # (allgather numbers each part's name inside a trace)
    combined = adasum.adasum(wires, lambda rows, part: allgather(rows, part, process_set),
                             name or "HvdkerasAdasum", process_sets.view(process_set).size,
                             float(prescale), float(postscale))
    return [value.astype(t.dtype) for value, t in zip(combined, originals)]


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      name: Optional[str] = None, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      compression: Any = None,
                      process_set: ProcessSet = global_process_set) -> List[jax.Array]:
    """Reduces a list of arrays over all ranks, one fused collective per dtype.

    Args:
        tensors: Arrays (any shapes; the same on every rank).
        average: Deprecated spelling of `op` (True means Average).
        name: The name every rank gives this call.
        op: `hvdkeras.Average` (default), `Sum`, `Min`, `Max`, `Product` or
            `Adasum` (floating tensors; see `hvdkeras/backends/adasum.py`).
        prescale_factor: Multiplies the inputs before the reduction.
        postscale_factor: Multiplies the results after it.
        compression: `hvdkeras.Compression.fp16` or `.bf16`.
        process_set: The ranks taking part (default all).

    Returns:
        The reduced arrays, in order.

    Example:

    ```python
    total_a, total_b = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ```
    """
    op = buffers.resolve_op(op, average)
    if op == Adasum:
        return _adasum(tensors, name, prescale_factor, postscale_factor, compression,
                       process_set)
    originals = [jnp.asarray(t) for t in tensors]
    base = ops.unique_name(name or "HvdkerasGroupedAllreduce", originals)
    wires = [_compress(t, compression) for t in originals]
    results: List[Any] = [None] * len(wires)
    groups: dict = {}
    for index, t in enumerate(wires):
        groups.setdefault(jnp.dtype(t.dtype).name, []).append(index)
    for dtype, chosen in groups.items():
        buffers.dtype_number(dtype, "allreduce", reducing=True)
        reduced = ops.allreduce([wires[i] for i in chosen],
                                base if len(groups) == 1 else f"{base}.{dtype}", op,
                                float(prescale_factor), float(postscale_factor),
                                _set_id(process_set))
        for i, value in zip(chosen, reduced):
            results[i] = value.astype(originals[i].dtype)
    return results


def allreduce(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = None, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> jax.Array:
    """Reduces one array over all ranks; every rank gets the result.

    Example:

    ```python
    mean = hvd.allreduce(jnp.array([1.0, 2.0]))
    ```
    """
    return grouped_allreduce([tensor], average, name or "HvdkerasAllreduce", op,
                             prescale_factor, postscale_factor, compression, process_set)[0]


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> jax.Array:
    """`root_rank`'s array on every rank.

    Example:

    ```python
    params = hvd.broadcast(params, root_rank=0)
    ```
    """
    array = jnp.asarray(tensor)
    buffers.dtype_number(jnp.dtype(array.dtype).name, "broadcast", reducing=False)
    view = process_sets.view(process_set)
    root = view.set_rank_of(int(root_rank), "root_rank")
    return ops.broadcast([array], ops.unique_name(name or "HvdkerasBroadcast", [array]), root,
                         view.set_id)[0]


def allgather(tensor: Any, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> jax.Array:
    """Every rank's array, concatenated along the first dimension (the same rows on
    every rank inside `jit`; outside, rows may differ: they are gathered on the host).

    Example:

    ```python
    everyone = hvd.allgather(jnp.array([hvd.rank()]))
    ```
    """
    array = jnp.atleast_1d(jnp.asarray(tensor))
    if not ops._tracing([array]):
        return _allgather_any_rows(array, name or "HvdkerasAllgather", process_set)
    return ops.allgather(array, ops.unique_name(name or "HvdkerasAllgather", [array]),
                         _set_id(process_set))


def _allgather_any_rows(array, name: str, process_set: ProcessSet) -> jax.Array:
    return jnp.asarray(arrays.allgather(jax.device_get(array), name, process_set))


def reducescatter(tensor: Any, name: Optional[str] = None, op: int = Average,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: ProcessSet = global_process_set) -> jax.Array:
    """Reduces, then each rank keeps its rows of the first dimension (the first
    rows % size ranks one more).

    Example:

    ```python
    mine = hvd.reducescatter(jnp.ones((4, 3)), op=hvd.Sum)
    ```
    """
    if op not in (Average, Sum):
        raise ValueError(f"hvdkeras.reducescatter takes hvdkeras.Sum or Average, got {op!r}.")
    array = jnp.asarray(tensor)
    return ops.reducescatter(array, ops.unique_name(name or "HvdkerasReducescatter", [array]),
                             op, float(prescale_factor), float(postscale_factor),
                             _set_id(process_set))


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank of the set has reached it."""
    buffers.barrier(set_id=_set_id(process_set))


def alltoall(tensor: Any, splits: Optional[Sequence[int]] = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set) -> Tuple[jax.Array, jax.Array]:
    """Sends `splits[r]` rows to rank r (equal parts by default).

    Eagerly any splits work. Inside `jax.jit` the parts must be equal (no
    `splits`, or equal ones) and every rank must pass the same number of
    rows: the shape of what a rank receives is fixed when the step compiles.
    Inside `jit` it is differentiable (the gradient goes back the same way).

    Args:
        tensor: The rows to send, split along the first dimension.
        splits: How many rows go to each rank of the set, in rank order.
        name: The name every rank gives this call.
        process_set: The ranks taking part (default all).

    Returns:
        (the received rows, the number received from each rank).

    Example:

    ```python
    received, counts = hvd.alltoall(rows, splits=[1, 2])
    ```
    """
    size = process_sets.view(process_set).size
    if isinstance(tensor, jax.core.Tracer) or isinstance(splits, jax.core.Tracer):
        return _alltoall_inside_jit(tensor, splits, name, process_set, size)
    array = np.asarray(tensor)
    split_list = None if splits is None else [int(s) for s in np.asarray(splits).tolist()]
    output, received = arrays.alltoall(array, split_list, name or "HvdkerasAlltoall",
                                       process_set)
    return jnp.asarray(output), jnp.asarray(np.asarray(received, np.int32))


def _alltoall_inside_jit(tensor: Any, splits: Any, name: Optional[str],
                         process_set: ProcessSet, size: int) -> Tuple[jax.Array, jax.Array]:
    array = jnp.asarray(tensor)
    rows = array.shape[0] if array.ndim else 0
    part = rows // size
    if isinstance(splits, jax.core.Tracer):
        raise ValueError("hvdkeras.alltoall inside jax.jit takes splits known when the step "
                         "compiles (a list, not a traced array): what a rank receives must have "
                         "a fixed shape. Call it eagerly for splits computed in the step.")
    if array.ndim == 0 or rows % size:
        raise ValueError(f"hvdkeras.alltoall inside jax.jit sends equal parts: the tensor's {rows} "
                         f"rows must split evenly over the {size} ranks. Pad the rows, or call it "
                         "eagerly with splits=.")
    if splits is not None and [int(s) for s in np.asarray(splits).tolist()] != [part] * size:
        raise ValueError(f"hvdkeras.alltoall inside jax.jit sends equal parts ({[part] * size} "
                         f"here), not splits={list(np.asarray(splits).tolist())}: the shape a rank "
                         "receives would depend on the other ranks' splits, which jax.jit needs "
                         "when it compiles. Call it eagerly for uneven splits.")
    base = ops.unique_name(name or "HvdkerasAlltoall", [array])
    output = ops.alltoall_equal(array, base, _set_id(process_set))
    return output, jnp.full((size,), part, jnp.int32)

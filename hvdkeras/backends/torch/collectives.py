"""hvdkeras's collectives on torch tensors, under Horovod's names and
arguments (the same as the TensorFlow functions in `hvdkeras.collectives`).

Each call runs when made and returns when every rank has made it; the
gradients flow through autograd (`hvdkeras.backends.torch.ops`).

What may import this module: the rest of `hvdkeras.backends.torch`, the facade's dispatch.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from hvdkeras.backends import adasum
from hvdkeras.backends.torch import ops
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Adasum, Average
from hvdkeras.host import buffers

def _set_id(process_set: ProcessSet) -> int:
    return process_sets.view(process_set).set_id


def _as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


def _compress(tensor: torch.Tensor, compression: Any) -> torch.Tensor:
    # The compressor names its wire dtype (hvdkeras.collectives.compression).
    name = getattr(compression, "wire_dtype", None)
    wire = None if name is None else getattr(torch, name)
    if wire is not None and tensor.is_floating_point() and tensor.dtype != wire:
        return tensor.to(wire)
    return tensor


def _adasum(tensors: Sequence[Any], name: Optional[str], prescale: float, postscale: float,
            compression: Any, process_set: ProcessSet) -> List[torch.Tensor]:
    originals = [_as_tensor(t) for t in tensors]
    wires = [_compress(t, compression) for t in originals]
    combined = adasum.adasum(wires, lambda rows, part: allgather(rows, part, process_set),
                             name or "HvdkerasAdasum", process_sets.view(process_set).size,
                             float(prescale), float(postscale))
    return [value.to(t.dtype) for value, t in zip(combined, originals)]


def grouped_allreduce(tensors: Sequence[Any], average: Optional[bool] = None,
                      name: Optional[str] = None, op: Optional[int] = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      compression: Any = None,
                      process_set: ProcessSet = global_process_set) -> List[torch.Tensor]:
    """Reduces a list of tensors over all ranks, one fused request per dtype.

    Args:
        tensors: CPU tensors (any shapes; the same on every rank).
        average: Deprecated spelling of `op` (True means Average).
        name: The name every rank gives this call (default: one per kind).
        op: `hvdkeras.Average` (default), `Sum`, `Min`, `Max`, `Product` or
            `Adasum` (floating tensors; see `hvdkeras/backends/adasum.py`).
        prescale_factor: Multiplies the inputs before the reduction.
        postscale_factor: Multiplies the results after it.
        compression: `hvdkeras.Compression.fp16` or `.bf16` sends floating
            tensors at half width; results come back in the input's dtype.
        process_set: The ranks taking part (default all).

    Returns:
        The reduced tensors, in order.

    Example:

    ```python
    total_a, total_b = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    ```
    """
    op = buffers.resolve_op(op, average)
    if op == Adasum:
        return _adasum(tensors, name, prescale_factor, postscale_factor, compression,
                       process_set)
    base = name or "HvdkerasGroupedAllreduce"
    originals = [_as_tensor(t) for t in tensors]
    wires = [_compress(t, compression) for t in originals]
    results: List[Optional[torch.Tensor]] = [None] * len(wires)
    groups: dict = {}
    for index, t in enumerate(wires):
        groups.setdefault(t.dtype, []).append(index)
    for dtype, chosen in groups.items():
        group_name = base if len(groups) == 1 else f"{base}.{str(dtype)[6:]}"
        reduced = ops.allreduce([wires[i] for i in chosen], group_name, op,
                                float(prescale_factor), float(postscale_factor),
                                _set_id(process_set))
        for i, value in zip(chosen, reduced):
            results[i] = value.to(originals[i].dtype)
    return results  # type: ignore[return-value]


def allreduce(tensor: Any, average: Optional[bool] = None, name: Optional[str] = None,
              compression: Any = None, op: Optional[int] = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduces one tensor over all ranks; every rank gets the result.

    Args: as `grouped_allreduce`, for one tensor.

    Returns:
        A tensor like `tensor` holding the reduction.

    Example:

    ```python
    mean = hvd.allreduce(torch.tensor([1.0, 2.0]))
    ```
    """
    return grouped_allreduce([tensor], average, name or "HvdkerasAllreduce", op,
                             prescale_factor, postscale_factor, compression, process_set)[0]


def broadcast(tensor: Any, root_rank: int, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """`root_rank`'s tensor, on every rank.

    Example:

    ```python
    weights = hvd.broadcast(weights, root_rank=0)
    ```
    """
    return ops.broadcast([_as_tensor(tensor)], name or "HvdkerasBroadcast", int(root_rank),
                         _set_id(process_set))[0]


def broadcast_(tensor: torch.Tensor, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place `broadcast`: `tensor` takes the root's values; returns it."""
    with torch.no_grad():
        tensor.copy_(broadcast(tensor, root_rank, name, process_set))
    return tensor


def allgather(tensor: Any, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's tensor, concatenated along the first dimension (which may
    differ per rank).

    Example:

    ```python
    everyone = hvd.allgather(torch.tensor([hvd.rank()]))
    ```
    """
    tensor = _as_tensor(tensor)
    if tensor.dim() == 0:
        tensor = tensor.reshape(1)
    return ops.allgather(tensor, name or "HvdkerasAllgather", _set_id(process_set))


def reducescatter(tensor: Any, name: Optional[str] = None, op: int = Average,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                  process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduces, then each rank keeps its rows of the first dimension (the
    first rows % size ranks one more).

    Example:

    ```python
    mine = hvd.reducescatter(torch.ones(4, 3), op=hvd.Sum)
    ```
    """
    return ops.reducescatter(_as_tensor(tensor), name or "HvdkerasReducescatter", op,
                             float(prescale_factor), float(postscale_factor),
                             _set_id(process_set))


def alltoall(tensor: Any, splits: Optional[Sequence[int]] = None, name: Optional[str] = None,
             process_set: ProcessSet = global_process_set) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sends `splits[r]` rows to rank r (equal parts by default).

    Returns:
        (the received rows, the number received from each rank).

    Example:

    ```python
    received, counts = hvd.alltoall(rows, splits=[1, 2])
    ```
    """
    split_list = [] if splits is None else [int(s) for s in _as_tensor(splits).tolist()]
    output, received = ops.alltoall(_as_tensor(tensor), split_list, name or "HvdkerasAlltoall",
                                    _set_id(process_set))
    return output, received


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank of the set has reached it."""
    buffers.barrier(set_id=_set_id(process_set))

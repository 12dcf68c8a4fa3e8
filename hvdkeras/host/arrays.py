"""Collectives on NumPy arrays, for what every backend shares (metric
averaging, broadcasting Keras variables, the callbacks).

Each returns new arrays and leaves its inputs alone. The dtype names are
NumPy's; bfloat16 has none in NumPy and is moved by the framework bindings.

What may import this module: everything above `hvdkeras.engine` (it loads no framework).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet
from hvdkeras.engine.types import Average
from hvdkeras.host import buffers


def _host(array: np.ndarray) -> buffers.HostTensor:
    return buffers.HostTensor(array.ctypes.data, tuple(array.shape), array.dtype.name)


def _set_id(process_set: Optional[ProcessSet]) -> int:
    return process_sets.view(process_set).set_id


def _contiguous(arrays: Sequence) -> List[np.ndarray]:
    return [np.require(a, requirements="C") for a in arrays]  # keeps 0-d arrays 0-d


def _outputs(dtype: np.dtype) -> Tuple[List[np.ndarray], buffers.Allocate]:
    """Arrays the engine fills once negotiation decided their shapes, and the
    allocator that makes them."""
    result: List[np.ndarray] = []

    def allocate(shape: Tuple[int, ...]) -> int:
        result.append(np.empty(shape, dtype=dtype))
        return result[-1].ctypes.data

    return result, allocate


def grouped_allreduce(arrays: Sequence, name: str = "hvdkeras_arrays_allreduce",
                      op: int = Average, prescale: float = 1.0, postscale: float = 1.0,
                      process_set: Optional[ProcessSet] = None) -> List[np.ndarray]:
    """Reduces arrays of one dtype over all ranks in one fused request.

    Example:

    ```python
    mean_loss, = grouped_allreduce([np.array([loss])])
    ```
    """
    inputs = _contiguous(arrays)
    outputs = [np.empty_like(a) for a in inputs]
    buffers.allreduce([_host(a) for a in inputs], [o.ctypes.data for o in outputs], name, op,
                      prescale, postscale, _set_id(process_set), keep=(inputs, outputs))
    return outputs


def allreduce(array, name: str = "hvdkeras_arrays_allreduce", op: int = Average,
              process_set: Optional[ProcessSet] = None) -> np.ndarray:
    """Reduces one array over all ranks."""
    return grouped_allreduce([np.asarray(array)], name, op, process_set=process_set)[0]


def grouped_broadcast(arrays: Sequence, root_rank: int = 0,
                      name: str = "hvdkeras_arrays_broadcast",
                      process_set: Optional[ProcessSet] = None) -> List[np.ndarray]:
    """Every rank gets `root_rank`'s arrays, one request per dtype (in their order)."""
    inputs = _contiguous(arrays)
    outputs = [np.empty_like(a) for a in inputs]
    for dtype in sorted({a.dtype.name for a in inputs}):
        chosen = [i for i, a in enumerate(inputs) if a.dtype.name == dtype]
        buffers.broadcast([_host(inputs[i]) for i in chosen],
                          [outputs[i].ctypes.data for i in chosen], f"{name}.{dtype}", root_rank,
                          _set_id(process_set), keep=(inputs, outputs))
    return outputs


def allgather(array, name: str = "hvdkeras_arrays_allgather",
              process_set: Optional[ProcessSet] = None) -> np.ndarray:
    """Every rank's array, concatenated along the first dimension."""
    inputs = _contiguous([np.atleast_1d(np.asarray(array))])
    result, allocate = _outputs(inputs[0].dtype)
    buffers.allgather([_host(inputs[0])], allocate, name, _set_id(process_set))
    return result[0]


def alltoall(array, splits: Optional[Sequence[int]] = None,
             name: str = "hvdkeras_arrays_alltoall",
             process_set: Optional[ProcessSet] = None) -> Tuple[np.ndarray, List[int]]:
    """Sends `splits[r]` rows to rank r (equal parts when None); returns the rows
    received and how many came from each rank."""
    inputs = _contiguous([np.atleast_1d(np.asarray(array))])
    result, allocate = _outputs(inputs[0].dtype)
    received = buffers.alltoall(_host(inputs[0]), splits, allocate, name, _set_id(process_set))
    return result[0], received

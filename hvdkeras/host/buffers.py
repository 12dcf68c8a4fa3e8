"""Collectives on host buffers named by address, shape and element type.

The framework-neutral middle of every non-TensorFlow binding: a binding
hands over its tensors' memory, this module checks the element type against
the library's table (Note [wire vocabulary] in ops/core/types.def) and runs
one synchronous request (`hvdkeras.engine.requests`).

What may import this module: the rest of `hvdkeras.host` and the framework bindings
in `hvdkeras.backends`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

from hvdkeras.engine import library, process_sets, requests
from hvdkeras.engine.types import REDUCE_OP_NAMES, Average, Sum


@dataclasses.dataclass(frozen=True)
class HostTensor:
    """A tensor's memory: address, shape, element type name (NumPy's spelling).

    Host memory unless `device` is a CUDA ordinal: then `stream` is the
    framework's stream (a `cudaStream_t` as an integer) the tensor was
    written on, and the collective is ordered after it (allreduce,
    broadcast and reducescatter take GPU tensors).
    """

    address: int
    shape: Tuple[int, ...]
    dtype: str
    device: int = -1
    stream: int = 0


def dtype_number(dtype: str, what: str, reducing: bool) -> int:
    """The engine's number for `dtype`; a clear error for a type it does not take."""
    vocabulary = library.vocabulary()
    allowed = vocabulary.reducible_names if reducing else vocabulary.movable_names
    if dtype not in allowed:
        raise TypeError(f"hvdkeras.{what} does not support dtype {dtype}; supported: "
                        f"{', '.join(allowed)}.")
    return next(d.value for d in vocabulary.dtypes if d.name == dtype)


def _one_dtype(tensors: Sequence[HostTensor], what: str) -> str:
    kinds = {t.dtype for t in tensors}
    if len(kinds) != 1:
        raise TypeError(f"hvdkeras.{what} takes tensors of one dtype per call, got "
                        f"{sorted(kinds)}: group them by dtype.")
    return kinds.pop()


def resolve_op(op: Optional[int], average: Optional[bool]) -> int:
    """The reduction from `op=` or Horovod's older `average=` (default Average)."""
    if op is not None and average is not None:
        raise ValueError("Pass either op= or the older average=, not both.")
    if average is not None:
        return Average if average else Sum
    return Average if op is None else op


def _check_op(op: int, what: str) -> None:
    if op not in REDUCE_OP_NAMES:
        raise ValueError(f"hvdkeras.{what}: unknown reduction {op!r}; use hvdkeras.Sum, "
                         "Average, Min, Max or Product.")


def submit_allreduce(inputs: Sequence[HostTensor], outputs: Sequence[int], name: str,
                     op: int = Average, prescale: float = 1.0, postscale: float = 1.0,
                     set_id: int = 0, keep=None) -> requests.Pending:
    """Starts reducing tensors of one dtype in one fused request into `outputs`
    (addresses; an output may be its input); wait on the returned request."""
    _check_op(op, "allreduce")
    dtype = dtype_number(_one_dtype(inputs, "allreduce"), "allreduce", reducing=True)
    process_sets.view_by_id(set_id)  # a clear error for a rank outside the set
    return requests.submit(requests.ALLREDUCE, name, _buffers(inputs), outputs, dtype, op,
                           prescale, postscale, process_set=set_id, keep=keep)


def allreduce(inputs: Sequence[HostTensor], outputs: Sequence[int], name: str, op: int = Average,
              prescale: float = 1.0, postscale: float = 1.0, set_id: int = 0,
              keep=None) -> None:
    """Reduces tensors of one dtype in one fused request into `outputs` (addresses)."""
    with submit_allreduce(inputs, outputs, name, op, prescale, postscale, set_id, keep).wait():
        pass


def broadcast(inputs: Sequence[HostTensor], outputs: Sequence[int], name: str, root_rank: int,
              set_id: int = 0, keep=None) -> None:
    """Broadcasts tensors of one dtype from `root_rank` into `outputs` (addresses)."""
    dtype = dtype_number(_one_dtype(inputs, "broadcast"), "broadcast", reducing=False)
    view = process_sets.view_by_id(set_id)
    root = view.set_rank_of(int(root_rank), "root_rank")
    with requests.run(requests.BROADCAST, name, _buffers(inputs), outputs, dtype, root=root,
                      process_set=set_id, keep=keep):
        pass


Allocate = Callable[[Tuple[int, ...]], int]


def _shaped(kind: int, what: str, inputs: Sequence[HostTensor], allocate: Allocate, name: str,
            reducing: bool, op: int = Average, prescale: float = 1.0, postscale: float = 1.0,
            splits: Sequence[int] = (), set_id: int = 0) -> List[int]:
    """Runs a collective whose outputs negotiation shapes; `allocate(shape)` returns
    the address an output is copied to. Returns alltoall's received splits."""
    dtype = dtype_number(_one_dtype(inputs, what), what, reducing=reducing)
    process_sets.view_by_id(set_id)
    with requests.run(kind, name, _buffers(inputs), None, dtype, op, prescale, postscale,
                      splits=splits, process_set=set_id, keep=inputs) as done:
        for index in range(len(inputs)):
            done.copy_output(index, allocate(done.shape(index)))
        return done.received_splits() if kind == requests.ALLTOALL else []


def allgather(inputs: Sequence[HostTensor], allocate: Allocate, name: str,
              set_id: int = 0) -> None:
    """Concatenates every rank's tensors along the first dimension."""
    _shaped(requests.ALLGATHER, "allgather", inputs, allocate, name, False,
            set_id=set_id)


def submit_allgather(inputs: Sequence[HostTensor], name: str, set_id: int = 0,
                     keep=None) -> requests.Pending:
    """Starts an allgather of host tensors of one dtype and returns at once.
    Once `wait()` returns, `shape(i)` and `copy_output(i, address)` of the
    finished request give output `i` (then release it).

    Example:

    ```python
    with submit_allgather([tensor], "rows").wait() as done:
        done.copy_output(0, address_of_room_for(done.shape(0)))
    ```
    """
    dtype = dtype_number(_one_dtype(inputs, "allgather"), "allgather", reducing=False)
    process_sets.view_by_id(set_id)
    return requests.submit(requests.ALLGATHER, name, _buffers(inputs), None, dtype,
                           process_set=set_id, keep=inputs if keep is None else keep)


def reducescatter(inputs: Sequence[HostTensor], allocate: Allocate, name: str, op: int = Average,
                  prescale: float = 1.0, postscale: float = 1.0, set_id: int = 0) -> None:
    """Reduces, then gives each rank its rows of the first dimension."""
    if op not in (Average, Sum):
        raise ValueError(f"hvdkeras.reducescatter takes hvdkeras.Sum or Average, got {op!r}.")
    _shaped(requests.REDUCESCATTER, "reducescatter", inputs, allocate, name, True, op, prescale,
            postscale, set_id=set_id)


def _into(kind: int, what: str, inputs: Sequence[HostTensor], outputs: Sequence[int], name: str,
          reducing: bool, op: int = Average, prescale: float = 1.0, postscale: float = 1.0,
          set_id: int = 0, keep=None) -> None:
    """Runs a collective into outputs the caller allocated (addresses)."""
    dtype = dtype_number(_one_dtype(inputs, what), what, reducing=reducing)
    process_sets.view_by_id(set_id)
    with requests.run(kind, name, _buffers(inputs), outputs, dtype, op, prescale, postscale,
                      process_set=set_id, keep=keep):
        pass


def allgather_into(inputs: Sequence[HostTensor], outputs: Sequence[int], name: str,
                   set_id: int = 0, keep=None) -> None:
    """`allgather` into outputs the caller allocated (addresses), each
    holding every rank's rows in rank order: the way for GPU tensors, whose
    outputs the engine cannot allocate. The caller learned the row counts
    beforehand (a small host allgather)."""
    _into(requests.ALLGATHER, "allgather", inputs, outputs, name, False, set_id=set_id,
          keep=keep)


def reducescatter_into(inputs: Sequence[HostTensor], outputs: Sequence[int], name: str,
                       op: int = Average, prescale: float = 1.0, postscale: float = 1.0,
                       set_id: int = 0, keep=None) -> None:
    """`reducescatter` into outputs the caller allocated (addresses), each
    holding this rank's `scatter_rows` of its input: the way for GPU tensors,
    whose outputs the engine cannot allocate."""
    if op not in (Average, Sum):
        raise ValueError(f"hvdkeras.reducescatter takes hvdkeras.Sum or Average, got {op!r}.")
    _into(requests.REDUCESCATTER, "reducescatter", inputs, outputs, name, True, op, prescale,
          postscale, set_id, keep)


def scatter_rows(rows: int, size: int, rank: int) -> int:
    """The rows of a `rows`-row tensor that `rank` of `size` keeps after a
    reducescatter (the first `rows % size` ranks keep one more): the split
    of the engine's ScatterRows (ops/core/collective_reducescatter.cc);
    tests/parallel/test_gather_scatter.py checks they agree."""
    return rows // size + (1 if rank < rows % size else 0)


def alltoall(tensor: HostTensor, splits: Optional[Sequence[int]], allocate: Allocate, name: str,
             set_id: int = 0) -> List[int]:
    """Sends `splits[r]` rows to rank r (equal parts when None); returns the rows received
    from each rank."""
    size = process_sets.view_by_id(set_id).size
    rows = tensor.shape[0] if tensor.shape else 0
    if splits is None:
        if rows % size:
            raise ValueError(f"hvdkeras.alltoall: {rows} rows do not split evenly over {size} "
                             "ranks; pass splits=.")
        splits = [rows // size] * size
    splits = [int(s) for s in splits]
    if len(splits) != size or sum(splits) != rows or min(splits) < 0:
        raise ValueError(f"hvdkeras.alltoall: splits {splits} must be {size} non-negative row "
                         f"counts adding up to the tensor's {rows} rows.")
    return _shaped(requests.ALLTOALL, "alltoall", [tensor], allocate, name, False,
                   splits=splits, set_id=set_id)


def barrier(name: str = "hvdkeras_barrier", set_id: int = 0) -> None:
    """Returns once every rank of the set has reached it."""
    with requests.run(requests.BARRIER, name, [], None, 0, process_set=set_id):
        pass


def _buffers(tensors: Sequence[HostTensor]) -> List[requests.Buffer]:
    return [requests.Buffer(t.address, tuple(int(d) for d in t.shape), t.device, t.stream)
            for t in tensors]

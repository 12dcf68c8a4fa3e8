"""Collectives over host buffers, for the bindings that are not TensorFlow
kernels (PyTorch's custom ops, NumPy arrays): submit one request to the
engine through its C entry points (ops/core/c_requests.cc), wait for it
with a bound, read what negotiation decided. `submit` returns at once and
its `Pending.wait` later (the torch optimizer reduces gradients while the
backward pass goes on: Note [reductions during the backward pass]).

`run` is synchronous: it returns when every rank has done its part, so
default names may repeat from one call to the next (Note
[collective names] in `hvdkeras.collectives.common`: the same holds for
eager TensorFlow ops).

What may import this module: the layers above `hvdkeras.engine` (the host
collectives and backend bindings; TensorFlow's `join` reads `JOIN_NAME`).
"""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

from hvdkeras.engine import c_api, library, world
from hvdkeras.engine.types import Average

# The engine's OpType numbers (ops/core/common.h; tests/test_vocabulary.py checks them).
ALLREDUCE, BROADCAST, ALLGATHER, ALLTOALL, REDUCESCATTER, BARRIER, JOIN = range(7)
KIND_NAMES = ("allreduce", "broadcast", "allgather", "alltoall", "reducescatter", "barrier",
              "join")
# Every rank's join is one collective, whichever backend or mode calls it.
JOIN_NAME = "hvdkeras.join"
_SUCCEEDED, _FAILED, _RUNNING = 0, 1, 2
# How long a wait outlasts the engine's stall bound: the engine's watchdog
# ends the job first when a rank never joins; this bound catches the rest.
_MARGIN_SECONDS = 30.0
_MAX_RANK = 32

# Buffers of requests whose wait gave up: the engine may still write into
# them (Note [request lifetime] in ops/core/c_requests.cc), so they are kept.
_abandoned: List[Any] = []


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One tensor handed to the engine: its address and shape, and for a GPU
    tensor its CUDA device ordinal and the framework's stream (a
    `cudaStream_t` as an integer) its inputs were written on; -1 and 0 for
    host memory."""

    address: int
    shape: Tuple[int, ...]
    device: int = -1
    stream: int = 0


class Finished:
    """A request that completed: the outputs the engine shaped, alltoall's splits."""

    def __init__(self, lib: ctypes.CDLL, request: int):
        self._lib = lib
        self._request = request

    def shape(self, index: int) -> Tuple[int, ...]:
        dims = (ctypes.c_int64 * _MAX_RANK)()
        rank = self._lib.hvdkeras_request_shape(self._request, index, dims, _MAX_RANK)
        if rank < 0:
            raise IndexError(f"request has no output {index}")
        return tuple(int(d) for d in dims[:rank])

    def copy_output(self, index: int, address: int) -> None:
        self._lib.hvdkeras_request_output(self._request, index, ctypes.c_void_p(address))

    def received_splits(self) -> List[int]:
        out = (ctypes.c_int64 * 4096)()
        count = self._lib.hvdkeras_request_received_splits(self._request, out, 4096)
        return [int(v) for v in out[:max(count, 0)]]

    def last_joined_rank(self) -> int:
        """A join's result: the rank that joined last."""
        return int(self._lib.hvdkeras_request_last_joined_rank(self._request))

    def release(self) -> None:
        self._lib.hvdkeras_request_release(self._request)

    def __enter__(self) -> "Finished":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _pointers(addresses: Sequence[int]) -> Any:
    return (ctypes.c_void_p * max(len(addresses), 1))(*addresses)


class Pending:
    """A submitted request: `wait()` returns it finished (or raises)."""

    def __init__(self, lib: ctypes.CDLL, request: int, kind: int, name: str, keep: Any):
        self._lib = lib
        self._request = request
        self._kind = kind
        self._name = name
        self._keep = keep

    def wait(self, bound_seconds: Optional[float] = None) -> Finished:
        """Waits, with the stall bound plus a margin, and returns the request
        finished (release it when done). `bound_seconds` replaces that bound
        for callers that started the engine without `init()`.

        A join waits for as long as the other ranks still work and the engine
        runs: the coordinator ends it with an error naming the ranks that
        neither joined nor ran a collective for twice the stall bound.

        Raises:
            RuntimeError: if the engine failed the op (the message names it),
                or it did not finish within the bound.
        """
        error = ctypes.create_string_buffer(c_api.ERROR_CAPACITY)
        if bound_seconds is None:
            stall = world.require().config.stall_shutdown_seconds
            bound_seconds = stall + _MARGIN_SECONDS if stall > 0 else 1e9
        bound = bound_seconds
        outcome = self._lib.hvdkeras_request_wait(self._request, bound, error,
                                                  c_api.ERROR_CAPACITY)
        while outcome == _RUNNING and self._kind == JOIN and self._lib.hvdkeras_engine_running():
            outcome = self._lib.hvdkeras_request_wait(self._request, bound, error,
                                                      c_api.ERROR_CAPACITY)
        if outcome == _SUCCEEDED:
            return Finished(self._lib, self._request)
        what = f"hvdkeras {KIND_NAMES[self._kind]} '{self._name}'"
        if outcome == _RUNNING:
            _abandoned.append(self._keep)
            raise RuntimeError(
                f"{what} did not finish within {bound:.0f} s: some rank never submitted it "
                "(HVDKERAS_STALL_SHUTDOWN_SECONDS sets the bound).")
        self._lib.hvdkeras_request_release(self._request)
        raise RuntimeError(f"{what} failed: {error.value.decode()}")


def submit(kind: int, name: str, inputs: Sequence[Buffer], outputs: Optional[Sequence[int]],
           dtype: int, op: int = Average, prescale: float = 1.0, postscale: float = 1.0,
           root: int = 0, splits: Sequence[int] = (), process_set: int = 0,
           keep: Any = None) -> Pending:
    """Hands one collective to the engine and returns at once; the buffers
    must stay alive and untouched until `wait()` returns.

    Args:
        kind: `ALLREDUCE`, `BROADCAST`, ...
        name: The name every rank gives this call.
        inputs: The tensors, all of element type `dtype` (the engine's number).
        outputs: Addresses of the caller's outputs (allreduce, broadcast; an
            output may be its input: reduced in place); None for the
            collectives whose output shape negotiation decides.
        keep: Whatever owns the buffers: kept alive if a wait gives up.

    Raises:
        RuntimeError: if the engine refused the op (the message names it).
    """
    places = {(b.device, b.stream) for b in inputs}
    if len(places) > 1:
        raise ValueError(f"hvdkeras {KIND_NAMES[kind]} '{name}' mixes tensors on different "
                         f"devices or streams {sorted(places)}; submit them separately.")
    device, stream = places.pop() if places else (-1, 0)
    lib = library.engine_handle()
    error = ctypes.create_string_buffer(c_api.ERROR_CAPACITY)
    ranks = (ctypes.c_int * max(len(inputs), 1))(*(len(b.shape) for b in inputs))
    flat = [d for b in inputs for d in b.shape]
    dims = (ctypes.c_int64 * max(len(flat), 1))(*flat)
    split_values = (ctypes.c_int64 * max(len(splits), 1))(*splits)
    request = lib.hvdkeras_request_submit(
        kind, name.encode(), len(inputs), _pointers([b.address for b in inputs]),
        _pointers(list(outputs) if outputs is not None else [0] * len(inputs)), ranks, dims,
        dtype, op, prescale, postscale, root, split_values, len(splits), process_set,
        device, stream or None, error, c_api.ERROR_CAPACITY)
    if request == 0:
        raise RuntimeError(f"hvdkeras {KIND_NAMES[kind]} '{name}': {error.value.decode()}")
    return Pending(lib, request, kind, name, keep)


def run(kind: int, name: str, inputs: Sequence[Buffer], outputs: Optional[Sequence[int]],
        dtype: int, op: int = Average, prescale: float = 1.0, postscale: float = 1.0,
        root: int = 0, splits: Sequence[int] = (), process_set: int = 0,
        keep: Any = None) -> Finished:
    """Runs one collective and returns it finished (release it when done);
    `submit` then `wait`, with the same arguments and errors."""
    return submit(kind, name, inputs, outputs, dtype, op, prescale, postscale, root, splits,
                  process_set, keep).wait()

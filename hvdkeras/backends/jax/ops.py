"""hvdkeras's collectives on JAX arrays: one FFI target, differentiable.

Each call is `jax.ffi.ffi_call` of the `hvdkeras_collective` target with
side effects (XLA keeps it even where a rank does not use the result); the
handler queues it and returns a future (Note [asynchronous jax
collectives] in ops/jax/ffi_collectives.cc). Gradients follow Note
[collective gradient conventions] in `hvdkeras/collectives/gradients.py`.

Names: outside `jit` a call waits for its result, so default names may
repeat. Inside `jit` the collectives of one step may be in flight together,
so each default name gets the number of collectives traced before it in this
process; every rank traces the same steps in the same order, so the numbers
agree. Code whose ranks trace different functions passes `name=`.

What may import this module: the rest of `hvdkeras.backends.jax`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import threading
from typing import Iterator, List, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hvdkeras.engine import binding_build, library, process_sets, requests
from hvdkeras.engine.config import collective_gradients
from hvdkeras.engine.types import Average, Sum
from hvdkeras.host import buffers

TARGET = "hvdkeras_collective"
_lock = threading.Lock()
_registered = False
_traced = itertools.count()
_order = threading.local()  # the chain of collectives_in_call_order, per tracing thread


def _register() -> None:
    """Compiles (once) and loads the binding, and registers its FFI target."""
    global _registered
    with _lock:
        if _registered:
            return
        import jaxlib  # lazy: its version names the compiled binding

        library.engine_handle()  # the engine first: the binding links against it
        path = binding_build.ensure_binding("jax", jaxlib.__version__, jax.ffi.include_dir())
        binding = ctypes.CDLL(str(path))
        jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(binding.HvdkerasJaxCollective),
                                    platform="cpu")
        # GPU arrays: the same collectives on XLA's CUDA stream, through the
        # engine's NCCL path (ops/jax/ffi_collectives.cc).
        jax.ffi.register_ffi_target(
            TARGET, jax.ffi.pycapsule(binding.HvdkerasJaxCollectiveCuda), platform="CUDA")
        _registered = True


def _tracing(values: Sequence) -> bool:
    return any(isinstance(v, jax.core.Tracer) for v in values)


def unique_name(name: str, values: Sequence) -> str:
    """`name`, numbered inside a trace (see the module's note on names)."""
    return f"{name}.{next(_traced)}" if _tracing(values) else name


def _dtype(array, what: str, reducing: bool) -> int:
    return buffers.dtype_number(jnp.dtype(array.dtype).name, what, reducing)


@contextlib.contextmanager
def collectives_in_call_order() -> Iterator[None]:
    """Inside, the collectives traced under `jit` run in the order they are
    called, on every rank (Note [collectives in call order]).

    Note [collectives in call order]
    ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
    XLA runs the side-effecting collective calls of a compiled step one at
    a time, in an order it derives from the data dependencies. Where every
    rank traces the same program that order is the same everywhere. A
    sharded optimizer step is not the same program on every rank (a rank
    uses only the results for the variables it owns; one that owns nothing
    uses none), and XLA ordered it differently per rank: the owner ran the
    gradients' reduction before the global norm's allreduce, a rank owning
    nothing the other way round, and each waited for the other until the
    stall bound ended the job. (An optimization barrier does not help: XLA
    drops one whose second output goes unused.) Inside this block each
    traced collective takes the previous one's first output as an extra
    operand that the handler never reads (`after` in
    ops/jax/ffi_collectives.cc), which fixes the call order everywhere. The
    output is recorded outside the `custom_vjp` functions (`_recorded`), whose
    own traces end with them.
    Blocks nest (the outermost one counts). A collective traced inside a
    `lax.cond` branch may follow one traced outside it; none may follow one
    traced inside a branch that has ended.
    """
    if getattr(_order, "active", False):
        yield
        return
    _order.active, _order.last = True, None
    try:
        yield
    finally:
        _order.active, _order.last = False, None


@contextlib.contextmanager
def call_order_after(value) -> Iterator[None]:
    """Inside, a chain of its own (Note [collectives in call order]) whose
    first traced collective follows `value` (None: nothing); the chain that
    was open, if any, continues after the block. For collectives traced in
    a function of their own (a `custom_vjp` rule) that must stay ordered."""
    saved = (getattr(_order, "active", False), getattr(_order, "last", None))
    _order.active, _order.last = True, value
    try:
        yield
    finally:
        _order.active, _order.last = saved


def last_in_order():
    """The output of the open chain's last traced collective, or None."""
    return getattr(_order, "last", None) if getattr(_order, "active", False) else None


def continue_after(value) -> None:
    """Makes the open chain's next collective follow `value` as well, when
    the chain has none yet (a step's collectives after work traced
    elsewhere in it). Nothing without an open chain or a value."""
    if value is not None and getattr(_order, "active", False) and _order.last is None:
        _order.last = value


# The platforms the binding's FFI target is registered for (JAX's names;
# "gpu" is an NVIDIA GPU here: _platform names an AMD one "rocm").
PLATFORMS = ("cpu", "gpu")


def _platform(device) -> str:
    """JAX's platform name of `device`, with an AMD GPU told apart from an
    NVIDIA one (JAX names both "gpu"; their clients' versions say which, as
    JAX itself reads them)."""
    if device.platform != "gpu":
        return device.platform
    version = str(getattr(getattr(device, "client", None), "platform_version", ""))
    return "rocm" if "rocm" in version.lower() else "gpu"


def _require_supported_arrays(inputs: Sequence, name: str) -> None:
    """A clear error for arrays on a platform the binding has no handler for
    (a TPU, an AMD GPU): XLA's own ("no registered implementation") does not
    say what to do."""
    # Traced values are on the default device: asked once, not per tensor.
    traced = any(isinstance(value, jax.core.Tracer) for value in inputs)
    platforms = {_platform(jax.devices()[0])} if traced else set()
    for value in inputs:
        if not isinstance(value, jax.core.Tracer) and hasattr(value, "devices"):
            platforms |= {_platform(device) for device in value.devices()}
    if platforms - set(PLATFORMS):
        raise ValueError(f"hvdkeras collective '{name}' runs on {' and '.join(PLATFORMS)} "
                         f"arrays under the JAX backend, and these are on {sorted(platforms)}. "
                         "Run JAX on the CPU (JAX_PLATFORMS=cpu) or an NVIDIA GPU.")


def _call(kind: int, name: str, inputs: List, outputs: List[jax.ShapeDtypeStruct], dtype: int,
          op: int = Average, prescale: float = 1.0, postscale: float = 1.0, root: int = 0,
          set_id: int = 0, parts: int = 0) -> List:
    _require_supported_arrays(inputs, name)
    _register()
    tracing = _tracing(inputs)
    ordered = tracing and getattr(_order, "active", False)
    after = [_order.last] if ordered and _order.last is not None else []
    call = jax.ffi.ffi_call(TARGET, outputs, has_side_effect=True, vmap_method="sequential")
    results = call(*inputs, *after, name=name, kind=np.int32(kind), dtype=np.int32(dtype),
                   reduce_op=np.int32(op), prescale=np.float64(prescale),
                   postscale=np.float64(postscale), root=np.int32(root),
                   process_set=np.int32(set_id), parts=np.int32(parts),
                   after=np.int32(len(after)))
    if not tracing:
        jax.block_until_ready(results)  # eager calls finish before the next may reuse the name
    return list(results)


def _recorded(collective):
    """`collective` (a custom_vjp function), whose first output the next call
    waits for inside `collectives_in_call_order`."""
    @functools.wraps(collective)
    def call(*args):
        results = collective(*args)
        if getattr(_order, "active", False):
            first = results[0] if isinstance(results, (list, tuple)) else results
            if isinstance(first, jax.core.Tracer):
                _order.last = first
        return results

    return call


def _like(arrays: Sequence) -> List[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def allreduce(arrays, name: str, op: int, prescale: float, postscale: float, set_id: int):
    """Reduces arrays of one dtype in one fused collective."""
    arrays = list(arrays)
    if not arrays:
        return []
    return _call(requests.ALLREDUCE, name, arrays, _like(arrays),
                 _dtype(arrays[0], "allreduce", True), op, prescale, postscale, set_id=set_id)


def _allreduce_fwd(arrays, name, op, prescale, postscale, set_id):
    return allreduce(arrays, name, op, prescale, postscale, set_id), None


def _allreduce_bwd(name, op, prescale, postscale, set_id, _, cotangents):
    if op not in (Sum, Average):
        raise ValueError("hvdkeras.allreduce has a gradient for Sum and Average only.")
    return (allreduce(list(cotangents), f"{name}_grad", op, postscale, prescale, set_id),)


allreduce.defvjp(_allreduce_fwd, _allreduce_bwd)
allreduce = _recorded(allreduce)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def broadcast(arrays, name: str, root: int, set_id: int):
    """`root`'s arrays (one dtype) on every rank of the set (`root` is a set rank)."""
    arrays = list(arrays)
    if not arrays:
        return []
    return _call(requests.BROADCAST, name, arrays, _like(arrays),
                 _dtype(arrays[0], "broadcast", False), root=root, set_id=set_id)


def _broadcast_fwd(arrays, name, root, set_id):
    return broadcast(arrays, name, root, set_id), None


def _exact_or_horovod() -> int:
    return Average if collective_gradients() == "horovod" else Sum


def _broadcast_bwd(name, root, set_id, _, cotangents):
    reduced = allreduce(list(cotangents), f"{name}_grad", _exact_or_horovod(), 1.0, 1.0, set_id)
    if process_sets.view_by_id(set_id).set_rank != root:
        reduced = [jnp.zeros_like(g) for g in reduced]
    return (reduced,)


broadcast.defvjp(_broadcast_fwd, _broadcast_bwd)
broadcast = _recorded(broadcast)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def allgather(array, name: str, set_id: int):
    """Every rank's array along the first dimension (equal rows on every rank inside
    `jit`, whose output shape is fixed when it compiles)."""
    size = process_sets.view_by_id(set_id).size
    shape = (array.shape[0] * size, *array.shape[1:])
    return _call(requests.ALLGATHER, name, [array], [jax.ShapeDtypeStruct(shape, array.dtype)],
                 _dtype(array, "allgather", False), set_id=set_id)[0]


def _allgather_fwd(array, name, set_id):
    return allgather(array, name, set_id), array.shape[0]


def _allgather_bwd(name, set_id, rows, cotangent):
    reduced = allreduce([cotangent], f"{name}_grad", _exact_or_horovod(), 1.0, 1.0, set_id)[0]
    start = process_sets.view_by_id(set_id).set_rank * rows
    return (jax.lax.dynamic_slice_in_dim(reduced, start, rows),)


allgather.defvjp(_allgather_fwd, _allgather_bwd)
allgather = _recorded(allgather)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def alltoall_equal(array, name: str, set_id: int):
    """Sends an equal part of the first dimension to every rank of the set (in
    rank order) and receives theirs: the shape stays, as `jit` needs."""
    size = process_sets.view_by_id(set_id).size
    return _call(requests.ALLTOALL, name, [array], _like([array]),
                 _dtype(array, "alltoall", False), set_id=set_id, parts=size)[0]


def _alltoall_fwd(array, name, set_id):
    return alltoall_equal(array, name, set_id), None


def _alltoall_bwd(name, set_id, _, cotangent):
    # Part k of the output came from rank k's part for this rank, so its
    # gradient goes back the same way: the exchange is its own inverse.
    return (alltoall_equal(cotangent, f"{name}_grad", set_id),)


alltoall_equal.defvjp(_alltoall_fwd, _alltoall_bwd)
alltoall_equal = _recorded(alltoall_equal)


def scattered_rows(rows: int, size: int, rank: int) -> int:
    """Rows of a reducescatter result on `rank` (the first rows % size get one more)."""
    return rows // size + (1 if rank < rows % size else 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def reducescatter(array, name: str, op: int, prescale: float, postscale: float, set_id: int):
    """Reduces, then each rank keeps its rows of the first dimension."""
    view = process_sets.view_by_id(set_id)
    rows = scattered_rows(array.shape[0], view.size, view.set_rank)
    return _call(requests.REDUCESCATTER, name, [array],
                 [jax.ShapeDtypeStruct((rows, *array.shape[1:]), array.dtype)],
                 _dtype(array, "reducescatter", True), op, prescale, postscale,
                 set_id=set_id)[0]


def _reducescatter_fwd(array, name, op, prescale, postscale, set_id):
    return reducescatter(array, name, op, prescale, postscale, set_id), array.shape[0]


def _reducescatter_bwd(name, op, prescale, postscale, set_id, rows, cotangent):
    view = process_sets.view_by_id(set_id)
    counts = [scattered_rows(rows, view.size, r) for r in range(view.size)]
    # Pad to equal rows so the gather's shape is fixed, then drop the padding.
    widest = max(counts)
    padded = jnp.pad(cotangent, [(0, widest - cotangent.shape[0])] +
                     [(0, 0)] * (cotangent.ndim - 1))
    gathered = allgather(padded, f"{name}_grad", set_id)
    pieces = [gathered[r * widest:r * widest + counts[r]] for r in range(view.size)]
    grad = jnp.concatenate(pieces) * (prescale * postscale)
    if op == Average and collective_gradients() != "horovod":
        grad = grad / view.size
    return (grad,)


reducescatter.defvjp(_reducescatter_fwd, _reducescatter_bwd)
reducescatter = _recorded(reducescatter)

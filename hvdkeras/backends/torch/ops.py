"""hvdkeras's collectives as torch custom ops (`torch.ops.hvdkeras.*`).

Registered with `torch.library.custom_op`, so eager code, autograd and
`torch.compile` (through the fake implementations, which only shape the
outputs) all see one op each. The gradients follow Note [collective
gradient conventions] in `hvdkeras/collectives/gradients.py`, as the
TensorFlow ops' do.

What may import this module: the rest of `hvdkeras.backends.torch`.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from hvdkeras.engine import process_sets
from hvdkeras.engine.config import collective_gradients
from hvdkeras.engine.types import Average, Sum
from hvdkeras.host import buffers


# The collectives that take CUDA tensors: their outputs are allocated here,
# on the tensor's device. Alltoall's outputs are shaped by the engine in host
# memory (ops/core/c_requests.cc), so it takes CPU tensors.
GPU_COLLECTIVES = ("allreduce", "broadcast", "reducescatter", "allgather")


def describe(tensor: torch.Tensor, what: str) -> buffers.HostTensor:
    """The engine's view of `tensor`'s memory. A CUDA tensor (allreduce,
    broadcast, reducescatter, allgather) goes with its device and torch's current
    stream there, which the engine's stream waits for and which waits for
    the results before the call returns (Note [stream order] in
    ops/core/device.h). A tensor made on another stream is marked as used
    by the current one (`record_stream`, as c10d does), so that torch's
    allocator does not hand its memory to that other stream's next
    allocation before the engine's stream, which only the current stream
    waits for, has read it."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    if tensor.device.type == "cuda" and what in GPU_COLLECTIVES:
        current = torch.cuda.current_stream(tensor.device)
        tensor.record_stream(current)  # nothing for a tensor made on `current`
        stream = current.cuda_stream
        return buffers.HostTensor(tensor.data_ptr(), tuple(tensor.shape), dtype,
                                  tensor.device.index, stream)
    if tensor.device.type != "cpu":
        supported = "CPU and CUDA" if what in GPU_COLLECTIVES else "CPU"
        raise ValueError(f"hvdkeras.{what} takes {supported} tensors under the torch backend; "
                         f"got one on {tensor.device}. Move it with .cpu().")
    return buffers.HostTensor(tensor.data_ptr(), tuple(tensor.shape), dtype)


def _per_dtype(tensors: Sequence[torch.Tensor], name: str) -> List[Tuple[str, List[int]]]:
    """One request per dtype: its name (`name`, or `name.<dtype>` when there
    are several) and the positions of its tensors, in dtype order."""
    by_dtype: Dict[str, List[int]] = {}
    for index, t in enumerate(tensors):
        by_dtype.setdefault(str(t.dtype), []).append(index)
    return [(name if len(by_dtype) == 1 else f"{name}.{dtype}", chosen)
            for dtype, chosen in sorted(by_dtype.items())]


def _inputs(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [t.detach().contiguous() for t in tensors]


@torch.library.custom_op("hvdkeras::allreduce", mutates_args=())
def allreduce(tensors: List[torch.Tensor], name: str, op: int, prescale: float,
              postscale: float, process_set_id: int) -> List[torch.Tensor]:
    inputs = _inputs(tensors)
    outputs = [torch.empty_like(t) for t in inputs]
    if inputs:
        buffers.allreduce([describe(t, "allreduce") for t in inputs],
                          [o.data_ptr() for o in outputs], name, op, prescale, postscale,
                          process_set_id, keep=(inputs, outputs))
    return outputs


@allreduce.register_fake
def _(tensors, name, op, prescale, postscale, process_set_id):
    return [torch.empty_like(t) for t in tensors]


def _allreduce_setup(ctx, inputs, output):
    _, name, op, prescale, postscale, process_set_id = inputs
    ctx.settings = (name, op, prescale, postscale, process_set_id)


def _allreduce_backward(ctx, grads):
    name, op, prescale, postscale, process_set_id = ctx.settings
    if op not in (Sum, Average):
        raise RuntimeError("hvdkeras.allreduce has a gradient for Sum and Average only.")
    grads = [g if g is not None else torch.zeros(()) for g in grads]
    reduced = allreduce(grads, f"{name}_grad", op, postscale, prescale, process_set_id)
    return reduced, None, None, None, None, None


allreduce.register_autograd(_allreduce_backward, setup_context=_allreduce_setup)


@torch.library.custom_op("hvdkeras::broadcast", mutates_args=())
def broadcast(tensors: List[torch.Tensor], name: str, root_rank: int,
              process_set_id: int) -> List[torch.Tensor]:
    inputs = _inputs(tensors)
    outputs = [torch.empty_like(t) for t in inputs]
    for request, chosen in _per_dtype(inputs, name):
        buffers.broadcast([describe(inputs[i], "broadcast") for i in chosen],
                          [outputs[i].data_ptr() for i in chosen], request, root_rank,
                          process_set_id, keep=(inputs, outputs))
    return outputs


@broadcast.register_fake
def _(tensors, name, root_rank, process_set_id):
    return [torch.empty_like(t) for t in tensors]


def _broadcast_setup(ctx, inputs, output):
    _, name, root_rank, process_set_id = inputs
    ctx.settings = (name, root_rank, process_set_id)


def _broadcast_backward(ctx, grads):
    # Exact: the root's input reaches every rank's output, so its gradient is
    # the sum of every rank's output gradient; other ranks' inputs are unused.
    name, root_rank, process_set_id = ctx.settings
    op = Average if collective_gradients() == "horovod" else Sum
    reduced = allreduce(list(grads), f"{name}_grad", op, 1.0, 1.0, process_set_id)
    view = process_sets.view_by_id(process_set_id)
    if view.ranks[view.set_rank] != root_rank:  # root_rank is a global rank
        reduced = [torch.zeros_like(g) for g in reduced]
    return reduced, None, None, None


broadcast.register_autograd(_broadcast_backward, setup_context=_broadcast_setup)


def reducible_in_place(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether `allreduce_in_place` may take `tensors`: run eagerly (not while
    `torch.compile` traces), contiguous CPU or CUDA tensors outside autograd."""
    return (not torch.compiler.is_compiling()
            and all(t.device.type in ("cpu", "cuda") and t.is_contiguous()
                    and not t.requires_grad
                    for t in tensors))


def allreduce_in_place(tensors: Sequence[torch.Tensor], name: str, op: int, prescale: float,
                       postscale: float, process_set_id: int) -> None:
    """Reduces `tensors` into themselves, one fused request per dtype (see
    `reducible_in_place`). Not an op: it mutates its arguments, for code that
    owns them (the distributed optimizer's gradients), and saves the fresh
    output a reduction otherwise allocates, whose first touch costs page
    faults on every step."""
    for request, chosen in _per_dtype(tensors, name):
        group = [tensors[i] for i in chosen]
        buffers.allreduce([describe(t, "allreduce") for t in group],
                          [t.data_ptr() for t in group], request, op, prescale, postscale,
                          process_set_id, keep=group)


def broadcast_in_place(tensors: Sequence[torch.Tensor], name: str, root_rank: int,
                       process_set_id: int) -> None:
    """`root_rank`'s values into `tensors` themselves (contiguous CPU tensors; no
    autograd, no new memory), one fused request per dtype. Not an op: it
    mutates its arguments, for code that owns them (the sharded optimizer's
    weights)."""
    if not all(t.is_contiguous() for t in tensors):
        raise ValueError(f"hvdkeras broadcast '{name}' writes in place and needs contiguous "
                         "tensors.")
    for request, chosen in _per_dtype(tensors, name):
        group = [tensors[i] for i in chosen]
        buffers.broadcast([describe(t, "broadcast") for t in group],
                          [t.data_ptr() for t in group], request, root_rank, process_set_id,
                          keep=group)


def _allocating(tensor: torch.Tensor):
    results: List[torch.Tensor] = []

    def allocate(shape) -> int:
        results.append(torch.empty(shape, dtype=tensor.dtype))
        return results[-1].data_ptr()

    return results, allocate


@torch.library.custom_op("hvdkeras::allgather", mutates_args=())
def allgather(tensor: torch.Tensor, name: str, process_set_id: int) -> torch.Tensor:
    source = tensor.detach().contiguous()
    if source.device.type == "cuda":
        # The engine cannot allocate GPU memory for torch: every rank's row
        # count first (a small host allgather), then the output on the
        # tensor's device, shaped as the engine will agree.
        rows = torch.tensor([source.shape[0] if source.dim() else 1], dtype=torch.int64)
        counts, allocate_counts = _allocating(rows)
        buffers.allgather([describe(rows, "allgather")], allocate_counts, f"{name}.rows",
                          process_set_id)
        output = source.new_empty((int(counts[0].sum()), *source.shape[1:]))
        buffers.allgather_into([describe(source, "allgather")], [output.data_ptr()], name,
                               process_set_id, keep=(source, output))
        return output
    results, allocate = _allocating(source)
    buffers.allgather([describe(source, "allgather")], allocate, name, process_set_id)
    return results[0]


@allgather.register_fake
def _(tensor, name, process_set_id):
    rows = torch.library.get_ctx().new_dynamic_size()
    return tensor.new_empty((rows, *tensor.shape[1:]))


def _allgather_setup(ctx, inputs, output):
    tensor, name, process_set_id = inputs
    ctx.settings = (name, process_set_id, tensor.shape[0] if tensor.dim() else 1)


def _allgather_backward(ctx, grad):
    # Each rank's rows reach every rank: sum the output gradients, keep own rows.
    name, process_set_id, rows = ctx.settings
    op = Average if collective_gradients() == "horovod" else Sum
    reduced = allreduce([grad], f"{name}_grad", op, 1.0, 1.0, process_set_id)[0]
    counts = allgather(torch.tensor([rows], dtype=torch.int64), f"{name}_grad_rows",
                       process_set_id)
    me = process_sets.view_by_id(process_set_id).set_rank
    start = int(counts[:me].sum())
    return reduced[start:start + rows], None, None


allgather.register_autograd(_allgather_backward, setup_context=_allgather_setup)


@torch.library.custom_op("hvdkeras::reducescatter", mutates_args=())
def reducescatter(tensor: torch.Tensor, name: str, op: int, prescale: float, postscale: float,
                  process_set_id: int) -> torch.Tensor:
    source = tensor.detach().contiguous()
    if source.device.type == "cuda":
        # The engine cannot allocate GPU memory for torch: this rank's rows
        # are allocated here, on the tensor's device.
        view = process_sets.view_by_id(process_set_id)
        rows = source.shape[0] if source.dim() else 1
        output = source.new_empty((buffers.scatter_rows(rows, view.size, view.set_rank),
                                   *source.shape[1:]))
        buffers.reducescatter_into([describe(source, "reducescatter")], [output.data_ptr()],
                                   name, op, prescale, postscale, process_set_id,
                                   keep=(source, output))
        return output
    results, allocate = _allocating(source)
    buffers.reducescatter([describe(source, "reducescatter")], allocate, name, op, prescale,
                          postscale, process_set_id)
    return results[0]


@reducescatter.register_fake
def _(tensor, name, op, prescale, postscale, process_set_id):
    rows = torch.library.get_ctx().new_dynamic_size()
    return tensor.new_empty((rows, *tensor.shape[1:]))


def _reducescatter_setup(ctx, inputs, output):
    _, name, op, prescale, postscale, process_set_id = inputs
    ctx.settings = (name, op, prescale * postscale, process_set_id)


def _reducescatter_backward(ctx, grad):
    # Every input row feeds one rank's output row: gather the output gradients.
    name, op, scale, process_set_id = ctx.settings
    gathered = allgather(grad.contiguous(), f"{name}_grad", process_set_id) * scale
    if op == Average and collective_gradients() != "horovod":
        gathered = gathered / process_sets.set_size(process_set_id)
    return gathered, None, None, None, None, None


reducescatter.register_autograd(_reducescatter_backward, setup_context=_reducescatter_setup)


@torch.library.custom_op("hvdkeras::alltoall", mutates_args=())
def alltoall(tensor: torch.Tensor, splits: List[int], name: str,
             process_set_id: int) -> List[torch.Tensor]:
    source = tensor.detach().contiguous()
    results, allocate = _allocating(source)
    received = buffers.alltoall(describe(source, "alltoall"), splits or None, allocate, name,
                                process_set_id)
    return [results[0], torch.tensor(received, dtype=torch.int32)]


@alltoall.register_fake
def _(tensor, splits, name, process_set_id):
    rows = torch.library.get_ctx().new_dynamic_size()
    return [tensor.new_empty((rows, *tensor.shape[1:])),
            torch.empty((process_sets.set_size(process_set_id),), dtype=torch.int32)]


def _alltoall_setup(ctx, inputs, output):
    _, _, name, process_set_id = inputs
    ctx.settings = (name, process_set_id, [int(v) for v in output[1]])


def _alltoall_backward(ctx, grads):
    # The gradient goes back the way the rows came.
    name, process_set_id, received = ctx.settings
    back = alltoall(grads[0].contiguous(), received, f"{name}_grad", process_set_id)[0]
    return back, None, None, None


alltoall.register_autograd(_alltoall_backward, setup_context=_alltoall_setup)

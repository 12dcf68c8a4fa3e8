"""The op library's collectives as Python calls: lists of tensors in, lists out.

The one place that calls the generated TensorFlow op wrappers; the public
wrappers around it check their arguments and choose the names (see Note
[collective names] in `common`).

What may import this module: the rest of `hvdkeras.collectives`.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tensorflow as tf

from hvdkeras import compat
from hvdkeras.collectives import xla_calls
from hvdkeras.collectives.common import names
from hvdkeras.engine import library


def in_xla() -> bool:
    """Whether the collective being built will be compiled by XLA (Note [xla collectives])."""
    return compat.in_xla_context()


def _refuse_in_xla(what: str) -> None:
    if in_xla():
        raise ValueError(xla_calls.XLA_UNSUPPORTED.format(what=what))


def one_consumer(outputs: List[tf.Tensor]) -> List[tf.Tensor]:
    """Routes the outputs of a multi-output collective through one IdentityN.

    The engine completes a kernel on its own thread, and TensorFlow's
    executor then queues every consumer of that kernel's outputs as a
    separate thread-pool task. With one IdentityN as the only consumer, one
    task is queued and the consumers behind it run inline (measured: 100
    outputs of one grouped allreduce returned from a `tf.function` in
    0.75 ms instead of 1.65 ms on two ranks; the same function with local
    multiplies takes 0.63 ms). Eagerly there is no executor.
    """
    if len(outputs) < 2 or tf.executing_eagerly():
        return list(outputs)
    return tf.identity_n(outputs)


def allreduce(tensors: List[tf.Tensor], op: int, prescale_factor: float,
              postscale_factor: float, name: Optional[str],
              process_set_id: int = 0) -> List[tf.Tensor]:
    """One fused allreduce of tensors of one dtype."""
    graph_name, tensor_name = names(name, "HvdkerasAllreduce")
    if in_xla():
        return xla_calls.allreduce(tensors, op, prescale_factor, postscale_factor, graph_name,
                                   process_set_id)
    return one_consumer(library.ops().hvdkeras_allreduce(
        tensors, reduce_op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, tensor_name=tensor_name,
        process_set_id=process_set_id, name=graph_name,
    ))


def allreduce_start(tensors: List[tf.Tensor], op: int, prescale_factor: float,
                    postscale_factor: float, name: Optional[str],
                    process_set_id: int = 0, priority: int = 0) -> tf.Tensor:
    """Starts one fused allreduce of tensors of one dtype; returns its handle
    for `allreduce_done` (Note [pending reductions] in
    ops/tf/pending_reductions.cc). Not under XLA. A `priority` above 0 runs
    it after the agreed ops of lower priority (Note [priority on the wire]
    in ops/core/wire_order.h)."""
    _refuse_in_xla("a pending allreduce")
    graph_name, tensor_name = names(name, "HvdkerasAllreduceStart")
    return library.ops().hvdkeras_allreduce_start(
        tensors, reduce_op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, tensor_name=tensor_name,
        process_set_id=process_set_id, priority=priority, name=graph_name)


def allreduce_done(handle: tf.Tensor, dtype: tf.DType, shapes: List[tf.TensorShape],
                   name: Optional[str] = None) -> List[tf.Tensor]:
    """The results of the allreduce `handle` names, once it has finished."""
    return one_consumer(library.ops().hvdkeras_allreduce_done(
        handle, T=dtype, N=len(shapes), shapes=shapes, name=name or "HvdkerasAllreduceDone"))


def broadcast(tensors: List[tf.Tensor], root_rank: int, name: Optional[str],
              process_set_id: int = 0) -> List[tf.Tensor]:
    """One fused broadcast from `root_rank` (its position in the process set)."""
    graph_name, tensor_name = names(name, "HvdkerasBroadcast")
    if in_xla():
        return xla_calls.broadcast(tensors, root_rank, graph_name, process_set_id)
    return one_consumer(library.ops().hvdkeras_broadcast(
        tensors, root_rank=root_rank, tensor_name=tensor_name,
        process_set_id=process_set_id, name=graph_name))


def allgather(tensors: List[tf.Tensor], name: Optional[str],
              process_set_id: int = 0) -> List[tf.Tensor]:
    """One fused allgather of tensors of one dtype."""
    _refuse_in_xla("allgather")
    graph_name, tensor_name = names(name, "HvdkerasAllgather")
    return one_consumer(library.ops().hvdkeras_allgather(
        tensors, tensor_name=tensor_name, process_set_id=process_set_id, name=graph_name))


def reducescatter(tensors: List[tf.Tensor], op: int, prescale_factor: float,
                  postscale_factor: float, name: Optional[str],
                  process_set_id: int = 0) -> List[tf.Tensor]:
    """One fused reducescatter of tensors of one dtype."""
    _refuse_in_xla("reducescatter")
    graph_name, tensor_name = names(name, "HvdkerasReducescatter")
    return one_consumer(library.ops().hvdkeras_reducescatter(
        tensors, reduce_op=op, prescale_factor=prescale_factor,
        postscale_factor=postscale_factor, tensor_name=tensor_name,
        process_set_id=process_set_id, name=graph_name))


def alltoall(tensor: tf.Tensor, splits: tf.Tensor, name: Optional[str],
             process_set_id: int = 0) -> Tuple[tf.Tensor, tf.Tensor]:
    """(rows received, rows received from each rank)."""
    _refuse_in_xla("alltoall")
    graph_name, tensor_name = names(name, "HvdkerasAlltoall")
    output, received = library.ops().hvdkeras_alltoall(
        tensor, splits, tensor_name=tensor_name, process_set_id=process_set_id,
        name=graph_name)
    return output, received


def barrier(name: Optional[str], process_set_id: int = 0) -> None:
    graph_name, tensor_name = names(name, "HvdkerasBarrier")
    library.ops().hvdkeras_barrier(tensor_name=tensor_name, process_set_id=process_set_id,
                                   name=graph_name)


def join(tensor_name: str) -> tf.Tensor:
    """The rank that joined last."""
    return library.ops().hvdkeras_join(tensor_name=tensor_name, name="HvdkerasJoin")

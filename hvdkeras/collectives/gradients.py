"""The gradients of the collectives, registered with TensorFlow on import.

`hvdkeras.collectives` imports this module, so any use of a collective has
its gradient registered. Collectives inside a gradient are named after the
forward op (see Note [collective names] in `common`).

What may import this module: `hvdkeras.collectives` (for its side effect).
"""

from __future__ import annotations

import tensorflow as tf

from hvdkeras.collectives import kernels
from hvdkeras.collectives.common import grad_name, scale_values
from hvdkeras.engine import world
from hvdkeras.engine.types import REDUCE_OP_NAMES, Average, Sum


@tf.RegisterGradient("HvdkerasAllreduce")
def _allreduce_grad(op, *grads):
    """The gradient of a sum (or average) is the sum (or average) of gradients."""
    reduce_op = op.get_attr("reduce_op")
    if reduce_op not in (Sum, Average):
        raise NotImplementedError(
            f"hvdkeras.allreduce has no gradient for op {REDUCE_OP_NAMES.get(reduce_op)}; "
            "only Sum and Average are differentiable."
        )
    # d(post * reduce(pre * x)) / dx = pre * post * reduce(dy) for Sum/Average.
    return kernels.allreduce(
        [tf.convert_to_tensor(g) for g in grads], reduce_op,
        op.get_attr("prescale_factor"), op.get_attr("postscale_factor"),
        grad_name(op, "HvdkerasAllreduceGrad"),
    )


@tf.RegisterGradient("HvdkerasBroadcast")
def _broadcast_grad(op, *grads):
    """Every rank's output came from the root: the root gets the summed gradient."""
    root_rank = op.get_attr("root_rank")
    summed = kernels.allreduce([tf.convert_to_tensor(g) for g in grads], Sum, 1.0, 1.0,
                               grad_name(op, "HvdkerasBroadcastGrad"))
    if world.rank() == root_rank:
        return summed
    # Non-root ranks must still run the allreduce, so their zeros depend on it
    # (`* 0`, Horovod's way): a bare zeros_like (static shape) is folded to a
    # constant and would leave the allreduce with no consumer on this rank.
    return [s * 0 for s in summed]


@tf.RegisterGradient("HvdkerasAllgather")
def _allgather_grad(op, *grads):
    """Every rank's output holds each input's rows: sum the gradients of all
    ranks' outputs, then keep this rank's rows."""
    grads = [tf.convert_to_tensor(g) for g in grads]
    summed = kernels.allreduce(grads, Sum, 1.0, 1.0, grad_name(op))
    rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in op.inputs])
    all_rows = kernels.allgather([rows[None, :]], grad_name(op, suffix="grad_rows"))[0]
    me = world.rank()
    start = tf.reduce_sum(all_rows[:me], axis=0)
    return [g[start[i]:start[i] + rows[i]] for i, g in enumerate(summed)]


@tf.RegisterGradient("HvdkerasAlltoall")
def _alltoall_grad(op, grad, _received_grad):
    """Rows went from rank s to rank d: their gradients go back from d to s."""
    received = op.outputs[1]
    back, _ = kernels.alltoall(tf.convert_to_tensor(grad), received,
                               grad_name(op) or "HvdkerasAlltoallGrad")
    return [back, None]


@tf.RegisterGradient("HvdkerasReducescatter")
def _reducescatter_grad(op, *grads):
    """Each input row fed one rank's output row: gather all output gradients."""
    reduce_op = op.get_attr("reduce_op")
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    if reduce_op == Average:
        scale /= world.size()
    gathered = kernels.allgather([tf.convert_to_tensor(g) for g in grads], grad_name(op))
    return [scale_values(g, scale) for g in gathered]

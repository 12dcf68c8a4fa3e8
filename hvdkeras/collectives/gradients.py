"""The gradients of the collectives, registered with TensorFlow on import.

`hvdkeras.collectives` imports this module, so any use of a collective has
its gradient registered. Collectives inside a gradient are named after the
forward op (see Note [collective names] in `common`) and run on the forward
op's process set.

Note [collective gradient conventions]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Each rank differentiates its own loss L_r. The allreduce gradient (Sum:
the sum of every rank's output gradient; Average: their average) is the
exact derivative of the total loss sum_r L_r, and Horovod agrees. For
allgather and broadcast, the exact derivative of that same total sums the
ranks' output gradients; reducescatter's is the gathered output gradient
(divided by the set's size for Average). Horovod scales these differently:
it averages for allgather and broadcast, and multiplies reducescatter's by
the set's size for Sum (and leaves Average's undivided). hvdkeras computes
the exact derivative by default, so one process and N processes agree; with
HVDKERAS_COLLECTIVE_GRADIENTS=horovod (hvdkeras/engine/config.py) it scales
as Horovod does, for ported code tuned to that. docs/coming-from-horovod.md
lists the difference.

What may import this module: `hvdkeras.collectives` (for its side effect).
"""

from __future__ import annotations

from typing import List

import tensorflow as tf

from hvdkeras.collectives import kernels
from hvdkeras.collectives.common import grad_name, per_dtype, scale_values
from hvdkeras.engine import process_sets
from hvdkeras.engine.config import collective_gradients
from hvdkeras.engine.types import REDUCE_OP_NAMES, Average, Sum


def _set_of(op) -> process_sets.SetView:
    return process_sets.view_by_id(op.get_attr("process_set_id"))


def _horovod() -> bool:
    return collective_gradients() == "horovod"


def _reduce_output_grads(op, grads, default_name: str, set_id: int) -> List[tf.Tensor]:
    """Every rank's output gradients, summed (exact) or averaged (Horovod's way).

    One allreduce per dtype: TensorFlow may hand float32 zeros for an output
    nobody used, beside float64 gradients of the others.
    """
    reduce_op = Average if _horovod() else Sum
    return per_dtype([tf.convert_to_tensor(g) for g in grads], grad_name(op, default_name),
                     lambda group, name: kernels.allreduce(group, reduce_op, 1.0, 1.0, name,
                                                           set_id))


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
        grad_name(op, "HvdkerasAllreduceGrad"), op.get_attr("process_set_id"),
    )


@tf.RegisterGradient("HvdkerasBroadcast")
def _broadcast_grad(op, *grads):
    """Every rank's output came from the root: the root gets the reduced gradient."""
    ps = _set_of(op)
    reduced = _reduce_output_grads(op, grads, "HvdkerasBroadcastGrad", ps.set_id)
    if ps.set_rank == op.get_attr("root_rank"):
        return reduced
    # Non-root ranks must still run the allreduce, so their zeros depend on it
    # (`* 0`, Horovod's way): a bare zeros_like (static shape) is folded to a
    # constant and would leave the allreduce with no consumer on this rank.
    return [s * 0 for s in reduced]


@tf.RegisterGradient("HvdkerasAllgather")
def _allgather_grad(op, *grads):
    """Every rank's output holds each input's rows: reduce the gradients of all
    ranks' outputs, then keep this rank's rows."""
    ps = _set_of(op)
    reduced = _reduce_output_grads(op, grads, "HvdkerasAllgatherGrad", ps.set_id)
    rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in op.inputs])
    all_rows = kernels.allgather([rows[None, :]], grad_name(op, suffix="grad_rows"),
                                 ps.set_id)[0]
    start = tf.reduce_sum(all_rows[:ps.set_rank], axis=0)
    return [g[start[i]:start[i] + rows[i]] for i, g in enumerate(reduced)]


@tf.RegisterGradient("HvdkerasAlltoall")
def _alltoall_grad(op, grad, _received_grad):
    """Rows went from rank s to rank d: their gradients go back from d to s."""
    received = op.outputs[1]
    back, _ = kernels.alltoall(tf.convert_to_tensor(grad), received,
                               grad_name(op) or "HvdkerasAlltoallGrad",
                               op.get_attr("process_set_id"))
    return [back, None]


@tf.RegisterGradient("HvdkerasReducescatter")
def _reducescatter_grad(op, *grads):
    """Each input row fed one rank's output row: gather all output gradients."""
    ps = _set_of(op)
    reduce_op = op.get_attr("reduce_op")
    scale = op.get_attr("prescale_factor") * op.get_attr("postscale_factor")
    if _horovod():
        scale *= ps.size if reduce_op == Sum else 1
    elif reduce_op == Average:
        scale /= ps.size
    # One allgather per dtype: an unused output's gradient may come as float32 zeros.
    gathered = per_dtype([tf.convert_to_tensor(g) for g in grads],
                         grad_name(op, "HvdkerasReducescatterGrad"),
                         lambda group, name: kernels.allgather(group, name, ps.set_id))
    return [scale_values(g, scale) for g in gathered]

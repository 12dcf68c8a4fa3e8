"""Broadcast: every rank gets the root rank's tensors or variable values.

What may import this module: `hvdkeras.collectives` and the layers above it.
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

import tensorflow as tf

from hvdkeras.collectives import gradients  # noqa: F401  (registers the gradients of its ops)
from hvdkeras.collectives import kernels
from hvdkeras.collectives.common import TensorLike, check_dtype, not_converted
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set


@not_converted
def broadcast(tensor: TensorLike, root_rank: int = 0, name: Optional[str] = None,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Copies `tensor` from `root_rank` to every rank.

    Args:
        tensor: A tensor with the same shape and dtype on every rank (bool and
            unsigned/16-bit integer types are allowed too).
        root_rank: The rank whose value everyone receives. All ranks must
            pass the same root; a mismatch fails on every rank.
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all
            ranks); `root_rank` is still a global rank, one of the set's.

    Returns:
        The root's tensor.

    Example:

    ```python
    seed = hvd.broadcast(tf.constant(np.random.randint(1 << 30)), root_rank=0)
    ```
    """
    ps = process_sets.view(process_set)
    root = ps.set_rank_of(int(root_rank), "root_rank")
    tensor = tf.convert_to_tensor(tensor)
    check_dtype(tensor, "broadcast", reducing=False)
    return kernels.broadcast([tensor], root, name, ps.set_id)[0]


@not_converted
def broadcast_variables(variables: Iterable, root_rank: int = 0,
                        name: Optional[str] = None,
                        process_set: ProcessSet = global_process_set) -> Optional[tf.Operation]:
    """Assigns every variable the value it has on `root_rank`.

    All variables travel in one fused broadcast (int32 ones in a second:
    on a GPU TensorFlow keeps int32 tensors in host memory, and one
    collective's tensors live in one kind of memory). Use it after building
    a model (and its optimizer) so every rank starts from the same state.

    Args:
        variables: TensorFlow or Keras variables, in the same order on every
            rank.
        root_rank: The rank whose values are kept.
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all).

    Returns:
        In TensorFlow 1 graph code, the op that runs every assignment; None
        eagerly and inside a `tf.function` (which runs them anyway).

    Example:

    ```python
    hvd.broadcast_variables(model.variables, root_rank=0)
    ```
    """
    assignments = _assign_from_root(list(variables), root_rank, name, process_set)
    if tf.executing_eagerly() or tf.inside_function():
        return None
    return tf.group(*assignments) if assignments else tf.no_op()


def _assign_from_root(variables: list, root_rank: int, name: Optional[str],
                      process_set: ProcessSet) -> list:
    """Broadcasts the variables' values and assigns them; the assignments' results."""
    ps = process_sets.view(process_set)
    root = ps.set_rank_of(int(root_rank), "root_rank")
    if not variables:
        return []
    values = [tf.convert_to_tensor(v) for v in variables]
    for v in values:
        check_dtype(v, "broadcast_variables", reducing=False)
    name = name or "HvdkerasBroadcastVariables"
    groups = ([i for i, v in enumerate(values) if v.dtype != tf.int32],
              [i for i, v in enumerate(values) if v.dtype == tf.int32])
    assignments: list = [None] * len(variables)
    for suffix, indices in zip(("", ".int32"), groups):
        if not indices:
            continue
        received = kernels.broadcast([values[i] for i in indices], root, name + suffix,
                                     ps.set_id)
        for i, value in zip(indices, received):
            assignments[i] = variables[i].assign(value)
    return assignments


def broadcast_global_variables(root_rank: int = 0) -> tf.Operation:
    """TensorFlow 1 graph code: broadcasts `tf.compat.v1.global_variables()`.

    Args:
        root_rank: The rank whose values are kept.

    Returns:
        The op that assigns every global variable (run it in the session).

    Raises:
        RuntimeError: when executing eagerly, where global variables do not
            exist; use `broadcast_variables(model.variables)` there.

    Example:

    ```python
    with tf.compat.v1.Session() as sess:
        sess.run(hvd.broadcast_global_variables(0))
    ```
    """
    if tf.executing_eagerly():
        raise RuntimeError("hvdkeras.broadcast_global_variables() is for TensorFlow 1 graph "
                           "code; eagerly, use hvdkeras.broadcast_variables(model.variables, "
                           "root_rank) or the BroadcastGlobalVariablesCallback.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank,
                               name="HvdkerasBroadcastGlobalVariables")


def broadcast_(variables: Sequence, root_rank: int, name: Optional[str] = None,
               process_set: ProcessSet = global_process_set) -> Sequence:
    """Horovod's in-place broadcast: `broadcast_variables`, returning `variables`.

    Args:
        variables: TensorFlow or Keras variables, in the same order on every rank.
        root_rank: The rank whose values are kept.
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all).

    Returns:
        Eagerly, `variables`, now holding the root's values; in graph code,
        one tensor per variable that assigns it when evaluated and holds
        the root's value (Horovod's in-place op outputs).

    Example:

    ```python
    hvd.broadcast_(model.trainable_variables, root_rank=0)
    ```
    """
    assigned = _assign_from_root(list(variables), root_rank, name, process_set)
    return variables if tf.executing_eagerly() else assigned

"""This process's place in the job as TensorFlow tensors: Horovod's `size_op`,
`rank_op`, `local_size_op`, `local_rank_op`, `cross_size_op`, `cross_rank_op`.

The values cannot change while the process runs (a resized job is a new set
of processes: see hvdkeras/runner/elastic.py), so each is an int32 constant,
which is what the Horovod ops evaluate to.
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from hvdkeras.engine import process_sets, world


def _as_tensor(value: Callable[[], int], name: Optional[str], default_name: str) -> tf.Tensor:
    return tf.constant(value(), dtype=tf.int32, name=name or default_name)


def size_op(process_set_id: int = 0, name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks, as an int32 tensor (`hvdkeras.size()`).

    Args:
        process_set_id: A registered process set's id (0: all ranks), whose
            size is returned.
        name: The op's name.

    Returns:
        A scalar int32 tensor.

    Example:

    ```python
    total = tf.cast(hvd.size_op(), tf.float32) * loss
    ```
    """
    return _as_tensor(lambda: process_sets.set_size(process_set_id), name,
                      "hvdkeras_size")


def rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank, as an int32 tensor (`hvdkeras.rank()`)."""
    return _as_tensor(world.rank, name, "hvdkeras_rank")


def local_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 tensor."""
    return _as_tensor(world.local_size, name, "hvdkeras_local_size")


def local_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's rank on its host, as an int32 tensor."""
    return _as_tensor(world.local_rank, name, "hvdkeras_local_rank")


def cross_size_op(name: Optional[str] = None) -> tf.Tensor:
    """The number of hosts with a rank of this local rank, as an int32 tensor."""
    return _as_tensor(world.cross_size, name, "hvdkeras_cross_size")


def cross_rank_op(name: Optional[str] = None) -> tf.Tensor:
    """This process's index among the ranks sharing its local rank, as an int32 tensor."""
    return _as_tensor(world.cross_rank, name, "hvdkeras_cross_rank")

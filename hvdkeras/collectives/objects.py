"""Collectives on picklable Python objects (serialised with cloudpickle) as
TensorFlow tensors, eagerly or in TensorFlow 1 graph code with a session:
TensorFlow's `broadcast_object` and `allgather_object`. Under the other
backends they are `hvdkeras.host.objects`'s, which the callbacks use under
every backend.

What may import this module: `hvdkeras.collectives` and the layers above it.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np
import tensorflow as tf

from hvdkeras.collectives.broadcasting import broadcast
from hvdkeras.collectives.gather_scatter import allgather
from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.host.objects import deserialised, serialised


def _evaluator(what: str, session: Any) -> Callable[[tf.Tensor], np.ndarray]:
    """How to get a collective's value now: eagerly, or through a TF1 session.

    Inside a `tf.function` there is no Python value to return: RuntimeError.
    """
    if tf.executing_eagerly():
        return lambda t: t.numpy()
    session = session or tf.compat.v1.get_default_session()
    if session is None:
        raise RuntimeError(f"hvdkeras.{what} works on Python objects: call it eagerly (or in "
                           "TensorFlow 1 graph code with a session), not inside a tf.function.")
    return session.run


def broadcast_object(obj: Any = None, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set, session: Any = None) -> Any:
    """Sends a picklable object from `root_rank` to every rank.

    Args:
        obj: The object (only the root's value matters; others may pass None).
            Any size: it travels as one byte tensor.
        root_rank: The rank whose object everyone receives.
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all).
        session: For TensorFlow 1 graph code: the session that runs the
            broadcast (default: the default session).

    Returns:
        The root's object, unpickled on every rank (the root gets `obj` back).

    Example:

    ```python
    config = hvd.broadcast_object(load_config() if hvd.rank() == 0 else None)
    ```
    """
    ps = process_sets.view(process_set)
    value = _evaluator("broadcast_object", session)
    base = name or "HvdkerasBroadcastObject"
    is_root = ps.ranks[ps.set_rank] == root_rank
    payload = serialised(obj) if is_root else None
    length = broadcast(tf.constant([payload.size if is_root else 0], tf.int64), root_rank,
                       name=f"{base}.length", process_set=process_set)
    length = value(length)
    if not is_root:
        payload = np.zeros(int(length[0]), np.uint8)
    data = value(broadcast(tf.constant(payload), root_rank, name=f"{base}.data",
                           process_set=process_set))
    return obj if is_root else deserialised([length[0]], data)[0]


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set,
                     session: Any = None) -> List[Any]:
    """Gathers one picklable object from every rank onto every rank.

    Args:
        obj: This rank's object (any size).
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all).
        session: For TensorFlow 1 graph code, as in `broadcast_object`.

    Returns:
        A list with every rank's object, in rank order.

    Example:

    ```python
    counts = hvd.allgather_object(len(my_shard))
    ```
    """
    process_sets.view(process_set)
    value = _evaluator("allgather_object", session)
    base = name or "HvdkerasAllgatherObject"
    payload = serialised(obj)
    lengths = value(allgather(tf.constant([payload.size], tf.int64), name=f"{base}.lengths",
                              process_set=process_set))
    data = value(allgather(tf.constant(payload), name=f"{base}.data", process_set=process_set))
    return deserialised(lengths, data)

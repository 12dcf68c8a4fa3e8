"""Collectives on picklable Python objects (serialised with cloudpickle).

What may import this module: `hvdkeras.collectives` and the layers above it.
"""

from __future__ import annotations

from typing import Any, List, Optional

import cloudpickle
import numpy as np
import tensorflow as tf

from hvdkeras.collectives.broadcasting import broadcast
from hvdkeras.collectives.gather_scatter import allgather
from hvdkeras.engine import world


def _require_eager(what: str) -> None:
    if not tf.executing_eagerly():
        raise RuntimeError(f"hvdkeras.{what} works on Python objects and must run eagerly, "
                           "not inside a tf.function.")


def broadcast_object(obj: Any = None, root_rank: int = 0, name: Optional[str] = None) -> Any:
    """Sends a picklable object from `root_rank` to every rank.

    Args:
        obj: The object (only the root's value matters; others may pass None).
            Any size: it travels as one byte tensor.
        root_rank: The rank whose object everyone receives.
        name: Name that matches this call across ranks.

    Returns:
        The root's object, unpickled on every rank (the root gets `obj` back).

    Example:

    ```python
    config = hvd.broadcast_object(load_config() if hvd.rank() == 0 else None)
    ```
    """
    world.require()
    _require_eager("broadcast_object")
    base = name or "HvdkerasBroadcastObject"
    is_root = world.rank() == root_rank
    payload = np.frombuffer(cloudpickle.dumps(obj), np.uint8) if is_root else None
    length = broadcast(tf.constant([payload.size if is_root else 0], tf.int64), root_rank,
                       name=f"{base}.length")
    if not is_root:
        payload = np.zeros(int(length.numpy()[0]), np.uint8)
    data = broadcast(tf.constant(payload), root_rank, name=f"{base}.data")
    return obj if is_root else cloudpickle.loads(data.numpy().tobytes())


def allgather_object(obj: Any, name: Optional[str] = None) -> List[Any]:
    """Gathers one picklable object from every rank onto every rank.

    Args:
        obj: This rank's object (any size).
        name: Name that matches this call across ranks.

    Returns:
        A list with every rank's object, in rank order.

    Example:

    ```python
    counts = hvd.allgather_object(len(my_shard))
    ```
    """
    world.require()
    _require_eager("allgather_object")
    base = name or "HvdkerasAllgatherObject"
    payload = np.frombuffer(cloudpickle.dumps(obj), np.uint8)
    lengths = allgather(tf.constant([payload.size], tf.int64), name=f"{base}.lengths").numpy()
    data = allgather(tf.constant(payload), name=f"{base}.data").numpy()
    out, offset = [], 0
    for n in lengths:
        out.append(cloudpickle.loads(data[offset:offset + n].tobytes()))
        offset += int(n)
    return out

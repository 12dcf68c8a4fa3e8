"""Collectives on picklable Python objects, serialised with cloudpickle and
moved as byte arrays (`hvdkeras.host.arrays`): no framework is involved, so
they serve every Keras backend and the callbacks, eagerly.

Under TensorFlow, `hvdkeras.broadcast_object` and `allgather_object` are
`hvdkeras.collectives.objects`'s, which also run in TensorFlow 1 graph code
with a session; under torch and JAX they are these.

What may import this module: everything above `hvdkeras.engine`.
"""

from __future__ import annotations

from typing import Any, List, Optional

import cloudpickle
import numpy as np

from hvdkeras.engine import process_sets
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.host import arrays


def serialised(obj: Any) -> np.ndarray:
    """`obj` pickled, as a byte array to send."""
    return np.frombuffer(cloudpickle.dumps(obj), np.uint8)


def deserialised(lengths: Any, data: np.ndarray) -> List[Any]:
    """The objects in `data`, the bytes of several pickles of `lengths` each."""
    out, offset = [], 0
    for n in lengths:
        out.append(cloudpickle.loads(data[offset:offset + int(n)].tobytes()))
        offset += int(n)
    return out


def broadcast_object(obj: Any = None, root_rank: int = 0, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set, session: Any = None) -> Any:
    """Sends a picklable object from `root_rank` to every rank.

    Args:
        obj: The object (only the root's value matters; others may pass None).
            Any size: it travels as one byte array.
        root_rank: The rank whose object everyone receives.
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all).
        session: Accepted for scripts written for TensorFlow 1 graphs; not used.

    Returns:
        The root's object, unpickled on every rank (the root gets `obj` back).

    Example:

    ```python
    config = hvd.broadcast_object(load_config() if hvd.rank() == 0 else None)
    ```
    """
    del session
    ps = process_sets.view(process_set)
    base = name or "HvdkerasBroadcastObject"
    is_root = ps.ranks[ps.set_rank] == root_rank
    payload = serialised(obj) if is_root else None
    length = np.array([payload.size if is_root else 0], np.int64)
    length, = arrays.grouped_broadcast([length], root_rank, f"{base}.length", process_set)
    if not is_root:
        payload = np.zeros(int(length[0]), np.uint8)
    data, = arrays.grouped_broadcast([payload], root_rank, f"{base}.data", process_set)
    return obj if is_root else deserialised(length, data)[0]


def allgather_object(obj: Any, name: Optional[str] = None,
                     process_set: ProcessSet = global_process_set,
                     session: Any = None) -> List[Any]:
    """Gathers one picklable object from every rank onto every rank.

    Args:
        obj: This rank's object (any size).
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks take part (default: all).
        session: Accepted for scripts written for TensorFlow 1 graphs; not used.

    Returns:
        A list with every rank's object, in rank order.

    Example:

    ```python
    counts = hvd.allgather_object(len(my_shard))
    ```
    """
    del session
    process_sets.view(process_set)
    base = name or "HvdkerasAllgatherObject"
    payload = serialised(obj)
    lengths = arrays.allgather(np.array([payload.size], np.int64), f"{base}.lengths",
                               process_set)
    return deserialised(lengths, arrays.allgather(payload, f"{base}.data", process_set))

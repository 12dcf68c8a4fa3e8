"""Pure synchronisation: barrier and join.

What may import this module: `hvdkeras.collectives` and the layers above it.
"""

from __future__ import annotations

from typing import Optional, Union

import tensorflow as tf

from hvdkeras.collectives import kernels
from hvdkeras.collectives.common import not_converted
from hvdkeras.engine import process_sets, world
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.requests import JOIN_NAME


@not_converted
def barrier(name: Optional[str] = None,
            process_set: ProcessSet = global_process_set) -> None:
    """Blocks until every rank has called `barrier` (with the same name).

    Args:
        name: Name that matches this call across ranks.
        process_set: The `ProcessSet` whose ranks wait for each other
            (default: all ranks).

    Example:

    ```python
    if hvd.rank() == 0:
        prepare_files()
    hvd.barrier()
    ```
    """
    ps = process_sets.view(process_set)
    kernels.barrier(name, ps.set_id)


@not_converted
def join() -> Union[int, tf.Tensor]:
    """Declares that this rank has no more data, and waits for the others.

    For uneven data: a rank that runs out of batches calls `join()`; until
    every rank has joined, it takes part in the other ranks' collectives with
    neutral contributions (zeros for Sum/Average, so averages still divide by
    the full world size; no rows for allgather; the identity for
    Min/Max/Product), so they can finish their remaining steps.

    Returns:
        The rank that joined last (a Python int eagerly, a tensor in a graph).

    Example:

    ```python
    for batch in my_shard:          # shards of different lengths
        train_step(batch)
    last = hvd.join()
    ```
    """
    world.require()
    # One fixed name: every rank's join is the same collective, eager or not.
    result = kernels.join(JOIN_NAME)
    return int(result.numpy()) if tf.executing_eagerly() else result

"""`join` for the backends that run collectives on host memory (torch, JAX):
one engine request, with no tensors and no framework.

What may import this module: the facade's dispatch table
(`hvdkeras.backends.dispatch`) and the layers above `hvdkeras.host`.
"""

from __future__ import annotations

from hvdkeras.engine import requests, world


def join() -> int:
    """Declares that this rank has no more data, and waits for the others.

    For uneven data: a rank that runs out of batches calls `join()`; until
    every rank has joined, it takes part in the other ranks' collectives with
    neutral contributions (zeros for Sum/Average, so averages still divide by
    the full world size; no rows for allgather; the identity for
    Min/Max/Product), so they can finish their remaining steps. The same
    collective as TensorFlow's `hvdkeras.join`; under torch and JAX it is
    called eagerly (not inside a jitted or compiled function).

    Returns:
        The rank that joined last, the same on every rank.

    Example:

    ```python
    for batch in my_shard:          # shards of different lengths
        train_step(batch)
    last = hvd.join()
    ```
    """
    world.require()
    with requests.run(requests.JOIN, requests.JOIN_NAME, [], None, 0) as done:
        return done.last_joined_rank()

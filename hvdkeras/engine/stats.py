"""What the engine has done since `init()`: `engine_stats()`.

Totals kept by the engine thread (ops and fused batches executed, bytes
reduced, time executing, time negotiating while ops waited) and read here at
no cost; callers take differences between two readings, as
`hvdkeras.callbacks.EngineStatsCallback` does per epoch.
"""

from __future__ import annotations

import dataclasses

from hvdkeras.engine import c_api, library
from hvdkeras.engine.world import require


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """Totals of this rank's engine (global process set) since `init()`.

    Attributes:
        ops: Collectives executed.
        batches: Batches executed: each fused buffer, and each op that ran
            alone, counts once.
        bytes_reduced: Bytes of allreduce and reducescatter inputs.
        execute_seconds: Time spent executing batches (reducing, copying,
            MPI or NCCL calls).
        wait_seconds: Time spent negotiating while some op was pending:
            mostly waiting for other ranks to submit the same collective.
        bytes_gathered: Bytes allgathered onto this rank, every rank's part
            (under `zero_stage=3`, the weights gathered for the steps).
        cycles: Negotiation rounds.
        cached_ops: Collectives agreed by their response-cache bit alone
            (the one-allreduce path); in a steady training loop, all of them.
        negotiated_ops: Collectives agreed through rank 0's coordinator
            (new names, changed shapes, evicted entries).
        cache_evictions: Response-cache entries dropped to make room; above
            zero, raise `HVDKERAS_CACHE_CAPACITY`.
    """

    ops: int = 0
    batches: int = 0
    bytes_reduced: int = 0
    execute_seconds: float = 0.0
    wait_seconds: float = 0.0
    bytes_gathered: int = 0
    cycles: int = 0
    cached_ops: int = 0
    negotiated_ops: int = 0
    cache_evictions: int = 0

    def __sub__(self, earlier: "EngineStats") -> "EngineStats":
        return EngineStats(*(getattr(self, f.name) - getattr(earlier, f.name)
                             for f in dataclasses.fields(self)))


def engine_stats() -> EngineStats:
    """This rank's engine totals since `init()`.

    Returns:
        An `EngineStats`; subtract an earlier reading for an interval.

    Example:

    ```python
    before = hvd.engine_stats()
    model.fit(x, y, epochs=1)
    spent = hvd.engine_stats() - before
    print(spent.bytes_reduced, spent.execute_seconds)
    ```
    """
    require()
    (ops, batches, reduced, gathered), (executing, waiting) = c_api.engine_stats(
        library.engine_handle())
    cycles, cached, negotiated, evictions = c_api.negotiation_stats(library.engine_handle())[:4]
    return EngineStats(ops=ops, batches=batches, bytes_reduced=reduced,
                       execute_seconds=executing, wait_seconds=waiting, bytes_gathered=gathered,
                       cycles=cycles, cached_ops=cached, negotiated_ops=negotiated,
                       cache_evictions=evictions)

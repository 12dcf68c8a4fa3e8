"""`EngineStatsCallback`: per-epoch figures of the training steps and of
hvdkeras's engine in the epoch logs (and so in TensorBoard, CSVLogger and
the history).

What may import this module: `hvdkeras.callbacks`.
"""

from __future__ import annotations

import time
from typing import Optional

import keras

from hvdkeras.engine.stats import EngineStats, engine_stats
from hvdkeras.report.run_data import ENGINE_PREFIX


def epoch_figures(spent: EngineStats, steps: int, seconds: float,
                  global_batch: Optional[int] = None) -> dict:
    """The logged figures of one epoch's `steps` training steps, which took
    `seconds` and cost the engine `spent`. Pure.

    Returns:
        A dict of ``hvdkeras_*`` keys: ``step_ms``, ``collective_ms_per_step``
        (executing collectives), ``wait_ms_per_step`` (waiting for other
        ranks), ``reduced_mb_per_step``, ``batches_per_step`` (fused buffers
        and lone ops), ``gathered_mb_per_step`` when the steps allgathered
        (the weights of `zero_stage=3`), and with `global_batch`
        ``examples_per_second``. Empty when no step ran.

    Example:

    >>> epoch_figures(EngineStats(ops=20, batches=2, bytes_reduced=2 << 20,
    ...                           execute_seconds=0.01, wait_seconds=0.002), 2, 0.1, 64)
    ... # doctest: +NORMALIZE_WHITESPACE
    {'hvdkeras_step_ms': 50.0, 'hvdkeras_collective_ms_per_step': 5.0,
     'hvdkeras_wait_ms_per_step': 1.0, 'hvdkeras_reduced_mb_per_step': 1.0,
     'hvdkeras_batches_per_step': 1.0, 'hvdkeras_examples_per_second': 1280.0}
    """
    if steps <= 0 or seconds <= 0:
        return {}
    figures = {
        "step_ms": 1e3 * seconds / steps,
        "collective_ms_per_step": 1e3 * spent.execute_seconds / steps,
        "wait_ms_per_step": 1e3 * spent.wait_seconds / steps,
        "reduced_mb_per_step": spent.bytes_reduced / steps / (1 << 20),
        "batches_per_step": spent.batches / steps,
    }
    if spent.bytes_gathered:
        figures["gathered_mb_per_step"] = spent.bytes_gathered / steps / (1 << 20)
    if global_batch:
        figures["examples_per_second"] = global_batch * steps / seconds
    return {ENGINE_PREFIX + k: round(v, 6) for k, v in figures.items()}


class EngineStatsCallback(keras.callbacks.Callback):
    """Adds this rank's step time and engine figures to each epoch's logs.

    Measured from the end of the epoch's first training batch (which holds
    tracing and compilation) to its last (validation excluded): ``hvdkeras_step_ms``,
    ``hvdkeras_collective_ms_per_step`` (the engine executing collectives),
    ``hvdkeras_wait_ms_per_step`` (the engine waiting for other ranks to
    submit them), ``hvdkeras_reduced_mb_per_step``,
    ``hvdkeras_batches_per_step`` (fused buffers and lone ops per step),
    ``hvdkeras_gathered_mb_per_step`` when the steps allgather (the weights
    under `zero_stage=3`) and, given the global batch,
    ``hvdkeras_examples_per_second``. Place it after
    `MetricAverageCallback` and before `keras.callbacks.TensorBoard` or
    `CSVLogger`, which then record the figures. Local: no collective.

    Args:
        global_batch: Examples per step over all ranks, for the throughput.

    Example:

    ```python
    model.fit(x, y, callbacks=[hvd.callbacks.MetricAverageCallback(),
                               hvd.callbacks.EngineStatsCallback(32 * hvd.size()),
                               keras.callbacks.TensorBoard("logs")])
    ```
    """

    def __init__(self, global_batch: Optional[int] = None) -> None:
        super().__init__()
        self.global_batch = global_batch
        self._start: Optional[EngineStats] = None
        self._end: Optional[EngineStats] = None
        self._began = self._ended = 0.0
        self._first = self._steps = 0

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._start = self._end = None
        self._steps = 0

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        # The epoch's first batch is left out: it holds tracing, a resumed
        # run's skipping, and the validation pass of the epoch before. With
        # steps_per_execution > 1 Keras reports the last batch of each run.
        now, stats = time.perf_counter(), engine_stats()
        if self._start is None:
            self._start, self._began, self._first = stats, now, batch
            return
        self._end, self._ended, self._steps = stats, now, batch - self._first

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        if logs is None or self._start is None or self._end is None:
            return
        logs.update(epoch_figures(self._end - self._start, self._steps,
                                  self._ended - self._began, self.global_batch))

"""`GPUStatsCallback`: each rank's GPU utilization, memory, power and
temperature in the epoch logs.

What may import this module: `hvdkeras.callbacks`.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import keras

from hvdkeras.engine import world
from hvdkeras.gpu import nvml
from hvdkeras.gpu.pin import pinned_device_entry
from hvdkeras.gpu.stats_logs import EpochSummary, logs_from
from hvdkeras.host.objects import allgather_object


class GPUStatsCallback(keras.callbacks.Callback):
    """Adds every rank's GPU readings (NVML) to the epoch logs.

    Each rank samples its own GPU at most every `interval_seconds` during
    training and once at the epoch's end; the ranks' figures are gathered so
    that every rank's logs hold ``rank{r}_gpu_utilization`` (mean %),
    ``rank{r}_gpu_memory_used_mb`` (peak MiB), ``rank{r}_gpu_power_w`` (mean
    W) and ``rank{r}_gpu_temperature_c`` (peak C). Place it before
    `keras.callbacks.TensorBoard` or `CSVLogger` so they record the figures.
    Without an NVIDIA driver rank 0 says so once and the logs are unchanged.
    Every rank must use it (the gathering is collective).

    Args:
        interval_seconds: the shortest time between two samples.

    Example:

    ```python
    model.fit(x, y, callbacks=[hvd.callbacks.GPUStatsCallback(),
                               keras.callbacks.TensorBoard("logs")])
    ```
    """

    def __init__(self, interval_seconds: float = 1.0) -> None:
        super().__init__()
        if interval_seconds <= 0:
            raise ValueError(f"GPUStatsCallback(interval_seconds={interval_seconds}): "
                             "give a positive number of seconds")
        self.interval_seconds = float(interval_seconds)
        self._handle: Any = None
        self._summary = EpochSummary()
        self._last_sample = 0.0

    def on_train_begin(self, logs: Optional[dict] = None) -> None:
        entry = pinned_device_entry()
        self._handle = nvml.handle_for(entry) if entry is not None else None
        if self._handle is None and world.rank() == 0:
            nvml.announce_once()

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._summary = EpochSummary()
        self._sample()

    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None:
        if time.monotonic() - self._last_sample >= self.interval_seconds:
            self._sample()

    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None:
        self._sample()
        gathered = allgather_object(self._summary.result(), name="hvdkeras.gpu_stats")
        if logs is not None:
            logs.update(logs_from(gathered))

    def _read(self) -> Optional[dict]:
        """One reading of this rank's GPU, or None without one."""
        return nvml.read(self._handle) if self._handle is not None else None

    def _sample(self) -> None:
        self._last_sample = time.monotonic()
        reading = self._read()
        if reading is not None:
            self._summary.add(reading)

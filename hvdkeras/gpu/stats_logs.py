"""GPU readings turned into Keras epoch logs: pure, tested without a GPU.

Over an epoch each rank samples its GPU now and then (`EpochSummary`); at the
epoch's end the ranks' summaries are gathered and `logs_from` names them per
rank: ``rank{r}_gpu_utilization`` (mean %), ``rank{r}_gpu_memory_used_mb``
(peak MiB), ``rank{r}_gpu_power_w`` (mean W), ``rank{r}_gpu_temperature_c``
(peak C). A rank without readings, or a quantity its GPU does not report,
adds nothing.

What may import this module: `hvdkeras.gpu` and the callbacks.
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

# Reading key -> (log name, how an epoch's samples combine).
QUANTITIES = {
    "utilization": ("gpu_utilization", "mean"),
    "memory_used_mb": ("gpu_memory_used_mb", "max"),
    "power_w": ("gpu_power_w", "mean"),
    "temperature_c": ("gpu_temperature_c", "max"),
}


class EpochSummary:
    """Combines one rank's readings over an epoch (means and peaks).

    Example:
    >>> s = EpochSummary()
    >>> s.add({"utilization": 50.0, "memory_used_mb": 100.0})
    >>> s.add({"utilization": 70.0, "memory_used_mb": 80.0})
    >>> s.result()
    {'utilization': 60.0, 'memory_used_mb': 100.0}
    """

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = {}

    def add(self, reading: Mapping[str, Optional[float]]) -> None:
        for key, value in reading.items():
            if key in QUANTITIES and value is not None:
                self._values.setdefault(key, []).append(float(value))

    def result(self) -> Optional[dict]:
        """The epoch's figures, or None when nothing was read."""
        if not self._values:
            return None
        out = {}
        for key, values in self._values.items():
            combine = QUANTITIES[key][1]
            out[key] = max(values) if combine == "max" else sum(values) / len(values)
        return out


def logs_from(summaries: Sequence[Optional[Mapping[str, float]]]) -> dict:
    """Epoch log entries for every rank's summary (by rank; None: nothing to add).

    Example:
    >>> logs_from([{"utilization": 60.0}, None])
    {'rank0_gpu_utilization': 60.0}
    """
    logs = {}
    for rank, summary in enumerate(summaries):
        for key, value in (summary or {}).items():
            if key in QUANTITIES and value is not None:
                logs[f"rank{rank}_{QUANTITIES[key][0]}"] = float(value)
    return logs

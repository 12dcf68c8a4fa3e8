"""What NVIDIA's management library (NVML, through nvidia-ml-py) says about
the GPUs: their names and memory for `hvdkeras check`, and readings of the
GPU this process uses for `GPUStatsCallback`.

NVML numbers GPUs physically and ignores `CUDA_VISIBLE_DEVICES`, so the GPU
this process uses is found from the entry `hvdkeras.gpu.pin` chose. Without an
NVIDIA driver every function here answers "nothing" and the first caller that
asks to be told says so once.

What may import this module: `hvdkeras.gpu`, the callbacks and the CLI.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Optional

_lock = threading.Lock()
_nvml: Any = None          # the pynvml module once initialised
_unavailable: Optional[str] = None  # why NVML cannot be used, once known
_announced = False


def _start() -> Any:
    """pynvml after nvmlInit(), or None (and `_unavailable` says why)."""
    global _nvml, _unavailable
    with _lock:
        if _nvml is None and _unavailable is None:
            try:
                import pynvml  # lazy: loaded only when GPU figures are asked for
            except ImportError:
                _unavailable = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
                return None
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as error:
                _unavailable = f"no NVIDIA driver was found ({error})"
                return None
            _nvml = pynvml
        return _nvml


def unavailable_reason() -> Optional[str]:
    """Why NVML cannot be used here, or None when it can."""
    _start()
    return _unavailable


def announce_once(prefix: str = "hvdkeras") -> None:
    """Prints, once per process, that NVML is unavailable and why (if it is)."""
    global _announced
    reason = unavailable_reason()
    if reason is None or _announced:
        return
    _announced = True
    print(f"{prefix}: {reason}; GPU statistics are off", file=sys.stderr, flush=True)


def device_count() -> int:
    """Physical GPUs on this machine (0 without a driver)."""
    nvml = _start()
    return nvml.nvmlDeviceGetCount() if nvml is not None else 0


def list_gpus() -> list[dict]:
    """Every physical GPU: index, name, UUID, total memory (MiB), driver version."""
    nvml = _start()
    if nvml is None:
        return []
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    gpus = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        gpus.append({
            "index": index,
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
            "memory_total_mb": nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20,
            "driver": driver,
        })
    return gpus


def handle_for(entry: str) -> Any:
    """The NVML handle of a `CUDA_VISIBLE_DEVICES` entry (ordinal or UUID), or None."""
    nvml = _start()
    if nvml is None:
        return None
    try:
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry.encode())
    except nvml.NVMLError:
        return None


def read(handle: Any) -> dict:
    """One reading of a GPU: utilization (%), memory used (MiB), power (W),
    temperature (C). A quantity the GPU does not report is None."""
    nvml = _start()

    def sample(function):
        try:
            return function()
        except nvml.NVMLError:  # e.g. power on GPUs that do not measure it
            return None

    return {
        "utilization": sample(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
        "memory_used_mb": sample(lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20),
        "power_w": sample(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
        "temperature_c": sample(lambda: float(
            nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)

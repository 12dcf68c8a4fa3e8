"""What `hvdkeras check` and `hvdkerasrun --check-build` say about GPUs: the op
library's GPU part (what it was built with, the libraries it finds, the GPUs
it can use) and the GPUs NVML lists.

What may import this module: the CLI.
"""

from __future__ import annotations

from typing import Mapping

from hvdkeras.engine import c_api, library
from hvdkeras.gpu import nvml


def gpu_rows(build_info: Mapping) -> list[tuple[str, object]]:
    """``(label, value)`` rows about the GPU part and the machine's GPUs."""
    rows: list[tuple[str, object]] = []
    if build_info.get("device") == "CUDA":
        lib = library.engine_handle()
        runtime = c_api.gpu_build_info(lib)
        count, description = c_api.gpu_probe(lib)
        rows += [
            ("GPU part", f"CUDA headers {build_info.get('cuda')}, NCCL headers "
                         f"{build_info.get('nccl')}"),
            ("NCCL library", runtime.get("nccl", "unknown")),
            ("NVRTC", runtime.get("nvrtc", "unknown")),
            ("CUDA runtime", description if count >= 0 else f"none usable: {description}"),
        ]
    else:
        reason = build_info.get("cuda_reason") or "not requested"
        rows.append(("GPU part", f"not built ({reason})"))
    gpus = nvml.list_gpus()
    if not gpus:
        rows.append(("GPUs (NVML)", f"none: {nvml.unavailable_reason() or 'no GPU found'}"))
    for gpu in gpus:
        rows.append((f"GPU {gpu['index']}",
                     f"{gpu['name']}, {gpu['memory_total_mb']:.0f} MiB, {gpu['uuid']}, "
                     f"driver {gpu['driver']}"))
    return rows

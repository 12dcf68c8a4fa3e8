"""CUDA contexts of this process per GPU, before and after `pin_gpu()` and a
first GPU collective (scripts/gpu_check.sh): a pinned rank must hold a
context on its own GPU alone. Exits 1 when it holds one elsewhere.

    python tests/scripts/gpu_contexts_job.py
"""
import os
import sys

import pynvml

import hvdkeras as hvd


def contexts() -> list[int]:
    """The GPUs on which this process holds a CUDA context (NVML's view)."""
    mine = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pids = {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        if os.getpid() in pids:
            mine.append(index)
    return mine


pynvml.nvmlInit()
hvd.init()
print(f"before pin_gpu(): contexts on GPUs {contexts()}")
device = hvd.pin_gpu()
print(f"after pin_gpu() ({device}): contexts on GPUs {contexts()}")
import tensorflow as tf  # noqa: E402  (after pinning, as users do)

with tf.device("/GPU:0"):
    total = hvd.allreduce(tf.ones([1024]), op=hvd.Sum).numpy()
after = contexts()
print(f"after a GPU allreduce (sum {total[0]}): contexts on GPUs {after}")
hvd.shutdown()
sys.exit(0 if len(after) <= 1 else 1)

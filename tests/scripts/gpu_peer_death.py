"""Rank 1 dies (SIGKILL) while rank 0 runs GPU allreduces through NCCL.

    mpiexec -n 2 python gpu_peer_death.py

Rank 0 prints "KILLED_AT <time>" before the kill and keeps reducing on its
GPU; the job must end within the stall bound, not leave rank 0's stream
waiting on NCCL forever. Used by tests/test_gpu.py where there are two GPUs.
"""
import os
import signal
import time

import tensorflow as tf

import hvdkeras as hvd

hvd.init()
hvd.pin_gpu()
rank = hvd.rank()
with tf.device("/GPU:0"):
    x = tf.ones([1 << 20])
    for step in range(5):
        hvd.allreduce(x, name=f"warm.{step}").numpy()
    if rank == 1:
        print(f"KILLED_AT {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    for step in range(100000):
        hvd.allreduce(x, name=f"after.{step}").numpy()
print("UNREACHABLE: the allreduces returned", flush=True)

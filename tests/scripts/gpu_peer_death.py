"""Rank 1 dies (SIGKILL) while both ranks are inside large NCCL allreduces.

    mpiexec -n 2 python gpu_peer_death.py

A thread of rank 1 prints "KILLED_AT <time>" and kills the process while
its main thread is in the middle of a 256 MiB allreduce on the GPU, so rank
0's NCCL kernel is left waiting for a peer that is gone (on one host no
NCCL transport reports that as an error). The job must still end within the
stall bound, not leave rank 0 on its GPU forever. Used by tests/test_gpu.py
where there are two GPUs.
"""
import os
import signal
import threading
import time

import tensorflow as tf

import hvdkeras as hvd

hvd.init()
hvd.pin_gpu()
rank = hvd.rank()
with tf.device("/GPU:0"):
    big = tf.ones([1 << 26])  # 256 MiB: each allreduce is on the link for a while
    for step in range(3):
        hvd.allreduce(big, name=f"warm.{step}").numpy()
    if rank == 1:
        def die() -> None:
            time.sleep(1.5)
            print(f"KILLED_AT {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=die, daemon=True).start()
    for step in range(100000):
        hvd.allreduce(big, name=f"after.{step}").numpy()
print("UNREACHABLE: the allreduces returned", flush=True)

"""GPU bandwidth probe: the device fusion buffer's copies and NCCL allreduce.

Run on a GPU machine, one rank per GPU:

    mpiexec -n 2 python examples/gpu_bandwidth_probe.py

1. Pack and unpack (rank 0, its GPU): N tensors copied into a fused buffer
   (each at a 256-byte aligned offset) and back out by the engine's batched
   copy kernel, one launch per 64 tensors, against the ceiling: one plain
   device-to-device copy of the same bytes each way. The target is a ratio
   of at least 0.8. The scaled column multiplies float32 on the way (what a
   prescale or an average costs).
2. NCCL allreduce through hvdkeras (every rank): float32 tensors on the GPU,
   median time per allreduce in a tf.function, algorithm bandwidth
   (bytes / time) and bus bandwidth (2 (n-1)/n * bytes / time, the
   convention of nccl-tests).

Without a usable GPU it says why and exits with status 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import hvdkeras as hvd  # noqa: E402
from hvdkeras.engine import c_api, library  # noqa: E402

PACK_CASES = ((1, 64 << 20), (16, 4 << 20), (64, 1 << 20), (256, 64 << 10), (1024, 16 << 10),
              (4096, 4 << 10))
ALLREDUCE_SIZES = (1 << 20, 16 << 20, 64 << 20, 256 << 20)


def pack_probe(iterations: int) -> None:
    print(f"{'tensors':>8} {'each':>8} {'packed GB/s':>12} {'plain GB/s':>11} {'ratio':>6} "
          f"{'scaled GB/s':>12}")
    for tensors, each in PACK_CASES:
        got = c_api.gpu_probe_copies(library.handle(), tensors, each, iterations)
        print(f"{tensors:>8} {each >> 10:>6}KB {got['packed']:>12.1f} {got['plain']:>11.1f} "
              f"{got['packed'] / got['plain']:>6.2f} {got['scaled']:>12.1f}")


def allreduce_probe(iterations: int) -> None:
    n = hvd.size()
    if hvd.rank() == 0:
        print(f"\n{'bytes':>8} {'ms':>8} {'algbw GB/s':>11} {'busbw GB/s':>11}   ({n} ranks)")
    for size in ALLREDUCE_SIZES:
        with tf.device("/GPU:0"):
            x = tf.ones([size // 4], tf.float32)

        @tf.function
        def step(t):
            return hvd.allreduce(t, op=hvd.Sum, name=f"probe.{size}")

        step(x).numpy()  # warm-up: tracing and the NCCL communicator
        times = []
        for _ in range(iterations):
            started = time.perf_counter()
            step(x)[0].numpy()
            times.append(time.perf_counter() - started)
        slowest = max(hvd.allgather_object(statistics.median(times)))
        if hvd.rank() == 0:
            algbw = size / slowest / 1e9
            print(f"{size >> 20:>6}MB {slowest * 1e3:>8.3f} {algbw:>11.2f} "
                  f"{algbw * 2 * (n - 1) / n:>11.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    hvd.init()
    hvd.pin_gpu()
    count, description = c_api.gpu_probe(library.handle())
    if count < 1:
        if hvd.rank() == 0:
            print(f"gpu_bandwidth_probe: nothing to measure: {description}")
        return 0
    if hvd.rank() == 0:
        print(f"gpu_bandwidth_probe: {description}")
        pack_probe(args.iterations)
    allreduce_probe(args.iterations)
    return 0


if __name__ == "__main__":
    sys.exit(main())

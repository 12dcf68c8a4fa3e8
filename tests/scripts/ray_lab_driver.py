"""A Ray driver for the Ray cluster on the network lab (tests/test_ray_cluster.py):
run in a process of its own, joined to the cluster through Ray Client.

    python ray_lab_driver.py RAY_CLIENT_ADDRESS NUM_PROC MODE READY_DIR

MODE is `run` (hvdkeras.ray.run: each rank's host and its allreduce) or
`lost` (ranks loop on allreduces; each writes READY_DIR/ready.<rank> with its
host, and the test takes one host down). Prints RESULT/FAILED/TOOK lines for
the test to read. The caller sets RAY_AUTH_MODE=disabled and
HVDKERAS_RAY_DRIVER_HOST (the address the actors reach this machine at).
"""

import os
import socket
import sys
import time

address, num_proc, mode, ready_dir = sys.argv[1:5]
num_proc = int(num_proc)

import ray  # noqa: E402

# Ray Client's head starts a server process per client; on a loaded 2-core
# machine that process has been seen to die while starting ("Starting Ray
# client server failed"), before any of this test's work began. A fresh
# connection starts a fresh server, so try a few times before failing.
for attempt in range(3):
    try:
        ray.init(address, logging_level="ERROR")
        break
    except ConnectionAbortedError as error:
        if attempt == 2 or "Starting Ray client server failed" not in str(error):
            raise
        print(f"ray_lab_driver: Ray Client's server failed to start (attempt {attempt + 1}); "
              "connecting again", file=sys.stderr, flush=True)
        ray.shutdown()
        time.sleep(5)

import hvdkeras.ray  # noqa: E402
from hvdkeras.runner.function_runner import RankFailedError  # noqa: E402


def ranks_and_hosts():
    import tensorflow as tf

    import hvdkeras as hvd

    hvd.init()
    total = hvd.allreduce(tf.fill([4], float(hvd.rank() + 1)), op=hvd.Sum, name="x")
    return hvd.rank(), socket.gethostname(), float(total.numpy()[0])


def loop_until_lost(directory):
    import tensorflow as tf

    import hvdkeras as hvd

    hvd.init()
    x = tf.ones([1 << 14])
    for step in range(10 ** 7):
        hvd.allreduce(x, name=f"loop.{step % 4}")
        if step == 5:
            path = os.path.join(directory, f"ready.{hvd.rank()}")
            with open(path + ".tmp", "w") as f:
                f.write(socket.gethostname())
            os.replace(path + ".tmp", path)
        time.sleep(0.01)


start = time.monotonic()
if mode == "run":
    for rank, host, total in hvdkeras.ray.run(ranks_and_hosts, num_proc=num_proc, timeout=240):
        print(f"RESULT rank {rank} host {host} sum {total:g}", flush=True)
elif mode == "lost":
    try:
        hvdkeras.ray.run(loop_until_lost, args=(ready_dir,), num_proc=num_proc, timeout=300,
                         env={"HVDKERAS_LIVENESS_SECONDS": "10"})
        print("UNREACHABLE: the run ended without an error", flush=True)
    except RankFailedError as error:
        print(f"FAILED after {time.monotonic() - start:.1f} s: {error}", flush=True)
print(f"TOOK {time.monotonic() - start:.1f} s", flush=True)

"""Rank 1 dies (os._exit(3) or SIGKILL) while rank 0 waits in an allreduce."""
import os
import signal
import sys
import time

import hvdkeras as hvd

mode = sys.argv[1]
hvd.init()
hvd.allreduce([1.0], name="warmup")  # both ranks are up and talking
if hvd.rank() == 1:
    time.sleep(1.0)  # let rank 0 block in the allreduce below
    print(f"FAILING_AT {time.time():.3f}", flush=True)
    if mode == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
print("rank 0 waiting in allreduce", flush=True)
hvd.allreduce([1.0], name="never_completes")
print("UNREACHABLE: allreduce returned", flush=True)

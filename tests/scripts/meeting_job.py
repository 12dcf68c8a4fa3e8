"""Ranks that do not meet in hvdkeras's set-up calls (hvdkeras.engine.agreement).

    mpiexec -n N python meeting_job.py MODE

skip_init:   the last rank never calls init(); the others' init() must fail
             within the stall bound, naming it.
skip_add:    the last rank never calls add_process_set(); the others' call
             must fail within the bound, naming it and what it says it does.
different:   rank 0 calls add_process_set() while the others call
             remove_process_set(): every rank fails at once, naming both.
no_join:     the last rank never calls join() and runs no collective; the
             others' join() must fail after twice the bound, naming it.
Each rank prints one line: RESULT <json> with its error and the seconds taken.
"""
import json
import sys
import time

import hvdkeras as hvd
from mpi4py import MPI

mode = sys.argv[1]
rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
last = rank == size - 1
result = {"rank": rank}
start = time.monotonic()
try:
    if mode == "skip_init":
        if last:
            time.sleep(float(sys.argv[2]))
        else:
            hvd.init()
    else:
        hvd.init()
        start = time.monotonic()
        if mode == "skip_add":
            if last:
                time.sleep(float(sys.argv[2]))
            else:
                hvd.add_process_set([0, 1])
        elif mode == "no_join":
            if last:
                time.sleep(float(sys.argv[2]))
            else:
                hvd.join()
        elif mode == "different":
            if rank == 0:
                hvd.add_process_set([0, 1])
            else:
                hvd.remove_process_set(hvd.global_process_set)
except Exception as e:  # the error is the result
    result["error"] = str(e)
    result["type"] = type(e).__name__
result["seconds"] = time.monotonic() - start
print("RESULT " + json.dumps(result), flush=True)

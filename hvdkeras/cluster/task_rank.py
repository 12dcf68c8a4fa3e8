"""One rank of a job on a cluster engine's tasks (`hvdkeras.spark.run`,
`hvdkeras.ray.run`): ``mpiexec -n 1 python -m hvdkeras.cluster.task_rank``.

Started by a task (see `hvdkeras.cluster.job`), configured through
``HVDKERAS_TASK_*`` variables. It fetches the function from the driver's
authenticated service, opens an MPI port, publishes it, waits for the other
ranks' ports, joins them (`connect.chain_connect`), calls
``hvdkeras.init(comm=world)`` and the function, and sends the result or the
exception (with its traceback) back to the driver.

What may import this module: nothing; the rank runs it with ``-m``
(importing it initializes MPI).
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import pickle
import signal
import sys
import time
import traceback

import cloudpickle
import mpi4py

# Note [a port-joined rank skips MPI_Finalize]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# These ranks join through MPI ports (Connect/Accept), and under MPICH's UCX
# netmod MPI_Finalize at such a rank's exit sometimes died of SIGSEGV: a
# core dump from the Spark lab (gdb) shows Py_FinalizeEx -> mpi4py's exit
# hook -> PMPI_Finalize -> ucp_worker_destroy -> ucs_mpool_cleanup's leak
# report -> ucp_proto_config_info_str calling through a dangling protocol
# pointer, after the rank had sent its result. MPI_Finalize is also
# collective over connected processes, a wait no rank can bound. So mpi4py
# does not finalize here: the rank's exit hooks run (hvdkeras shuts its
# engine down in one), the interpreter exits with the rank's code, and
# mpiexec takes an exit without MPI_Finalize as any other (every rank of
# these jobs runs this module, so none waits in MPI_Finalize for another).
mpi4py.rc.finalize = False
from mpi4py import MPI  # noqa: E402  (after the setting above)

from hvdkeras.engine.world import init
from hvdkeras.runner.service import Client
from hvdkeras.runner.task_files import error_record
from hvdkeras.cluster import connect
from hvdkeras.cluster.task_env import (ADDRESS_ENV, DEFAULT_START_TIMEOUT_S, INDEX_ENV,
                                       SECRET_FILE_ENV, SIZE_ENV, START_TIMEOUT_ENV, take_secret)


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _wait_for_ports(client, size: int, timeout: float) -> list:
    deadline = time.monotonic() + timeout
    while True:
        reply = client.request("get_ports")
        if reply["abort"]:
            raise RuntimeError(f"job aborted before all ranks joined: {reply['abort']}")
        if reply["ports"] is not None:
            return reply["ports"]
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all {size} ranks published their MPI port within {timeout:g} s")
        time.sleep(0.05)


def main() -> int:
    _die_with_parent()
    # A rank that dies on a signal (a crash inside a native library) prints
    # every thread's Python stack first, so its task's error shows where.
    faulthandler.enable(all_threads=True)
    host, _, port = os.environ[ADDRESS_ENV].rpartition(":")
    index, size = int(os.environ[INDEX_ENV]), int(os.environ[SIZE_ENV])
    secret = take_secret(os.environ.pop(SECRET_FILE_ENV))
    client = Client((host, int(port)), secret)
    try:
        task = client.request("task")
        my_port = MPI.Open_port()
        client.request("put_port", index=index, port=my_port)
        ports = _wait_for_ports(client, size, float(os.environ.get(START_TIMEOUT_ENV)
                                                    or DEFAULT_START_TIMEOUT_S))
        world = connect.chain_connect(MPI, index, size, ports)
        MPI.Close_port(my_port)
        fn, args, kwargs = pickle.loads(task)
        init(comm=world)
        result = fn(*args, **kwargs)
        client.request("put_result", rank=index, blob=cloudpickle.dumps(result))
        return 0
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the driver
        formatted = traceback.format_exc()
        sys.stderr.write(formatted)
        sys.stderr.flush()
        try:
            client.request("put_error", record=error_record(index, exc, formatted))
        except Exception as report_exc:  # the driver is gone: the exit code still tells
            sys.stderr.write(f"could not report the error to the driver: {report_exc}\n")
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())

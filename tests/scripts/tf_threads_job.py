"""MPI job for tests/test_tf_threads_mpi.py: what hvdkeras.init() did to TensorFlow's pools.

    mpiexec -n N python tf_threads_job.py [early]

With `early`, a TensorFlow op runs before init(). Every rank prints one line
`RESULT {...}`: its rank, both pool sizes after init(), whether idle pool
threads were told not to spin, the warnings init() raised, the value of an
allreduce run afterwards (or the error init() raised).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from mpi4py import MPI  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402

import hvdkeras as hvd  # noqa: E402

out = {"rank": MPI.COMM_WORLD.Get_rank()}
if "early" in sys.argv[1:]:
    tf.constant(1.0) + 1.0  # starts TensorFlow's runtime before init()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        hvd.init()
    except ValueError as e:
        out["error"] = str(e)
out["warnings"] = [str(w.message) for w in caught if "hvdkeras" in str(w.message)]
out["intra"] = tf.config.threading.get_intra_op_parallelism_threads()
out["inter"] = tf.config.threading.get_inter_op_parallelism_threads()
out["no_spinning"] = context.context().config.experimental.disable_thread_spinning
if "error" not in out:
    value = tf.function(lambda: hvd.allreduce(tf.fill([3], float(hvd.rank() + 1)), op=hvd.Sum))()
    out["allreduce"] = value.numpy().tolist()
    hvd.shutdown()
os.write(1, ("RESULT " + json.dumps(out) + "\n").encode())  # one write: lines of two ranks never mix

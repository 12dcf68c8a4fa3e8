"""hvdkeras: data-parallel training for Keras 3 on TensorFlow over MPI.

A Horovod user changes one import line::

    import hvdkeras as hvd   # was: import horovod.tensorflow.keras as hvd
"""

from hvdkeras.basics import (
    cross_rank,
    cross_size,
    engine_config,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_threads_supported,
    rank,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from hvdkeras.collectives import (
    Average,
    Max,
    Min,
    Product,
    Sum,
    allreduce,
    broadcast,
    broadcast_variables,
    grouped_allreduce,
)
from hvdkeras.gather_scatter import (
    allgather,
    alltoall,
    grouped_allgather,
    grouped_reducescatter,
    reducescatter,
)
from hvdkeras.object_collectives import allgather_object, broadcast_object
from hvdkeras.synchronization import barrier, join

__version__ = "0.1.0"

__all__ = [
    "Average", "Max", "Min", "Product", "Sum", "allgather", "allgather_object", "allreduce",
    "alltoall", "barrier", "broadcast", "broadcast_object", "broadcast_variables", "cross_rank",
    "cross_size", "engine_config", "grouped_allgather", "grouped_allreduce",
    "grouped_reducescatter", "init", "is_homogeneous", "is_initialized", "join", "local_rank",
    "local_size", "mpi_threads_supported", "rank", "reducescatter", "shutdown", "size",
    "start_timeline", "stop_timeline",
]

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

__version__ = "0.1.0"

__all__ = [
    "Average", "Max", "Min", "Product", "Sum", "allreduce", "broadcast",
    "broadcast_variables", "cross_rank", "cross_size", "engine_config", "grouped_allreduce",
    "init", "is_homogeneous", "is_initialized", "local_rank", "local_size",
    "mpi_threads_supported", "rank", "shutdown", "size",
]

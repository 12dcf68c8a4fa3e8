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

# --- Keras 3 integration (issue 4) -----------------------------------------
from hvdkeras import callbacks, schedules
from hvdkeras.checkpointing import restore_from_checkpoint, save_model_atomic
from hvdkeras.compression import Compression
from hvdkeras.gradient_tape import DistributedGradientTape
from hvdkeras.model_sync import broadcast_model
from hvdkeras.optimizer import DistributedOptimizer, is_distributed
from hvdkeras.output import fit_verbose
from hvdkeras.schedules import scale_lr

__all__ += [
    "Compression", "DistributedGradientTape", "DistributedOptimizer", "broadcast_model",
    "callbacks", "fit_verbose", "is_distributed", "restore_from_checkpoint",
    "save_model_atomic", "scale_lr", "schedules",
]

# --- Launching (issue 5): hvdkerasrun's launch(), the function runner -------
# (hvdkeras.spark is a subpackage imported on demand: it needs the [spark] extra.)
from hvdkeras import runner
from hvdkeras.runner import RankFailedError, Runner, run
from hvdkeras.runner.launch import launch

__all__ += ["RankFailedError", "Runner", "launch", "run", "runner"]

# --- YAML training recipes (issue 6): `hvdkeras train/validate/recipes` ------
# hvdkeras.recipes holds the schema, the per-rank entry point and the bundled
# recipes; load_recipe validates a recipe file (RecipeError lists every problem).
from hvdkeras import recipes
from hvdkeras.recipes import RecipeError, load_recipe

__all__ += ["RecipeError", "load_recipe", "recipes"]

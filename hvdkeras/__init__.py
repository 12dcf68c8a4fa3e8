"""hvdkeras: data-parallel training for Keras 3 on TensorFlow over MPI.

A Horovod user changes one import line::

    import hvdkeras as hvd   # was: import horovod.tensorflow.keras as hvd

The public names below are loaded on first use (PEP 562 module
`__getattr__`): `import hvdkeras`, `hvdkeras --help`, `hvdkerasrun` and recipe
validation import neither TensorFlow nor mpi4py until something needs them.
Where each name lives is in `_PUBLIC`; `docs/architecture.md` maps the
packages.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

__version__ = "0.1.0"

# Public modules, by the name they have here.
_PUBLIC_MODULES: Dict[str, str] = {
    "callbacks": "hvdkeras.callbacks",
    "elastic": "hvdkeras.elastic",
    "schedules": "hvdkeras.training.schedules",
    "runner": "hvdkeras.runner",
    "recipes": "hvdkeras.recipes",
    "inputs": "hvdkeras.inputs",
}

# Other public names -> the module that defines them.
_PUBLIC: Dict[str, str] = {
    # This process's world (hvdkeras.engine.world).
    **dict.fromkeys(
        ("init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank",
         "cross_size", "cross_rank", "is_homogeneous", "mpi_threads_supported",
         "start_timeline", "stop_timeline", "engine_config"), "hvdkeras.engine.world"),
    "EngineStats": "hvdkeras.engine.stats",
    "engine_stats": "hvdkeras.engine.stats",
    # Process sets.
    **dict.fromkeys(("ProcessSet", "add_process_set", "remove_process_set",
                     "global_process_set"), "hvdkeras.engine.process_sets"),
    # What it was built with, under Horovod's names.
    **dict.fromkeys(
        ("mpi_built", "mpi_enabled", "nccl_built", "cuda_built", "gloo_built", "gloo_enabled",
         "ccl_built", "rocm_built", "ddl_built", "mlsl_built"), "hvdkeras.engine.capabilities"),
    # GPUs.
    "pin_gpu": "hvdkeras.gpu.pin",
    # Reductions.
    **dict.fromkeys(("Average", "Sum", "Min", "Max", "Product", "Adasum"),
                    "hvdkeras.engine.types"),
    # Collectives.
    **dict.fromkeys(
        ("allreduce", "grouped_allreduce", "broadcast", "broadcast_", "broadcast_variables",
         "broadcast_global_variables",
         "allgather",
         "grouped_allgather", "alltoall", "reducescatter", "grouped_reducescatter", "barrier",
         "join", "allgather_object", "broadcast_object", "size_op", "rank_op", "local_size_op",
         "local_rank_op", "cross_size_op", "cross_rank_op"), "hvdkeras.collectives"),
    # Keras training.
    "DistributedOptimizer": "hvdkeras.training.optimizer",
    "PartialDistributedOptimizer": "hvdkeras.training.optimizer",
    "PartialDistributedGradientTape": "hvdkeras.training.gradient_tape",
    "is_distributed": "hvdkeras.training.optimizer",
    "DistributedGradientTape": "hvdkeras.training.gradient_tape",
    "Compression": "hvdkeras.collectives.compression",
    "broadcast_model": "hvdkeras.training.model_sync",
    # torch.optim, under horovod.torch's names.
    **dict.fromkeys(("broadcast_parameters", "broadcast_optimizer_state"),
                    "hvdkeras.backends.torch.state_broadcast"),
    "SyncBatchNormalization": "hvdkeras.training.sync_batch_norm",
    "save_model_atomic": "hvdkeras.training.checkpoint_writing",
    "gathered_optimizer_state": "hvdkeras.sharding.state_transfer",
    "keras3_weights_path": "hvdkeras.training.keras2_paths",
    "keras3_model_path": "hvdkeras.training.keras2_paths",
    "load_model": "hvdkeras.training.model_loading",
    "restore_from_checkpoint": "hvdkeras.training.checkpoint_restore",
    "restore_training_position": "hvdkeras.training.checkpoint_restore",
    "TrainingPosition": "hvdkeras.training.checkpoint_restore",
    "fit_verbose": "hvdkeras.training.output",
    "scale_lr": "hvdkeras.training.schedules",
    # Each rank's share of the data (Note [shard before shuffling]).
    "shard_dataset": "hvdkeras.inputs.tf_data",
    "DistributedSampler": "hvdkeras.inputs.torch_data",
    **dict.fromkeys(("shard_arrays", "ShardedPyDataset"), "hvdkeras.inputs.arrays"),
    # Launching.
    "run": "hvdkeras.runner.function_runner",
    "Runner": "hvdkeras.spark.horovod_runner",
    "RankFailedError": "hvdkeras.runner.function_runner",
    "launch": "hvdkeras.runner.launch",
    # YAML recipes.
    "RecipeError": "hvdkeras.recipes.validation",
    "load_recipe": "hvdkeras.recipes",
}

__all__: List[str] = sorted([*_PUBLIC_MODULES, *_PUBLIC])


def __getattr__(name: str) -> Any:
    if name in _PUBLIC_MODULES:
        value = importlib.import_module(_PUBLIC_MODULES[name])
    elif name in _PUBLIC:
        value = getattr(importlib.import_module(_module_of(name)), name)
    else:
        raise AttributeError(f"module 'hvdkeras' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def _module_of(name: str) -> str:
    """Where public `name` lives under this process's Keras backend (see
    `hvdkeras/backends/dispatch.py`); TensorFlow's unless a backend has its own."""
    from hvdkeras.backends import dispatch  # lazy: the facade imports nothing up front

    if name not in dispatch.DISPATCHED:
        return _PUBLIC[name]
    from hvdkeras.engine import frameworks  # lazy: as above; it reads Keras's backend

    return dispatch.module_for(name, frameworks.keras_backend(), _PUBLIC[name])


def __dir__() -> List[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what static analysers and IDEs see; nothing runs
    from hvdkeras import callbacks, elastic, inputs, recipes, runner
    from hvdkeras.collectives import (allgather, allgather_object, allreduce, alltoall, barrier,
                                      broadcast, broadcast_, broadcast_global_variables,
                                      broadcast_object, broadcast_variables,
                                      cross_rank_op, cross_size_op, grouped_allgather,
                                      grouped_allreduce, grouped_reducescatter, join,
                                      local_rank_op, local_size_op, rank_op, reducescatter,
                                      size_op)
    from hvdkeras.engine.capabilities import (ccl_built, cuda_built, ddl_built, gloo_built,
                                              gloo_enabled, mlsl_built, mpi_built, mpi_enabled,
                                              nccl_built, rocm_built)
    from hvdkeras.engine.process_sets import (ProcessSet, add_process_set, global_process_set,
                                              remove_process_set)
    from hvdkeras.engine.stats import EngineStats, engine_stats
    from hvdkeras.engine.types import Adasum, Average, Max, Min, Product, Sum
    from hvdkeras.engine.world import (cross_rank, cross_size, engine_config, init,
                                       is_homogeneous, is_initialized, local_rank, local_size,
                                       mpi_threads_supported, rank, shutdown, size,
                                       start_timeline, stop_timeline)
    from hvdkeras.gpu.pin import pin_gpu
    from hvdkeras.inputs.arrays import ShardedPyDataset, shard_arrays
    from hvdkeras.inputs.tf_data import shard_dataset
    from hvdkeras.inputs.torch_data import DistributedSampler
    from hvdkeras.recipes import load_recipe
    from hvdkeras.recipes.validation import RecipeError
    from hvdkeras.runner.function_runner import RankFailedError, run
    from hvdkeras.spark.horovod_runner import Runner
    from hvdkeras.runner.launch import launch
    from hvdkeras.training import schedules
    from hvdkeras.training.checkpoint_restore import (TrainingPosition, restore_from_checkpoint,
                                                      restore_training_position)
    from hvdkeras.sharding.state_transfer import gathered_optimizer_state
    from hvdkeras.training.keras2_paths import keras3_model_path, keras3_weights_path
    from hvdkeras.training.checkpoint_writing import save_model_atomic
    from hvdkeras.collectives.compression import Compression
    from hvdkeras.training.gradient_tape import (DistributedGradientTape,
                                                 PartialDistributedGradientTape)
    from hvdkeras.training.model_loading import load_model
    from hvdkeras.training.model_sync import broadcast_model
    from hvdkeras.backends.torch.state_broadcast import (broadcast_optimizer_state,
                                                         broadcast_parameters)
    from hvdkeras.training.sync_batch_norm import SyncBatchNormalization
    from hvdkeras.training.optimizer import (DistributedOptimizer, PartialDistributedOptimizer,
                                             is_distributed)
    from hvdkeras.training.output import fit_verbose
    from hvdkeras.training.schedules import scale_lr

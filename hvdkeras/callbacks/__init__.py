"""Keras callbacks for distributed training (names as in Horovod).

Recommended order (see `standard_callbacks`): broadcast, metric average,
learning-rate callbacks, your own callbacks, checkpoint. Every hvdkeras
callback prepares the model when Keras hands it over (`_prepare`).

What may import it: the recipes' training code and the top-level package.
It imports `hvdkeras.training`, `hvdkeras.collectives`, `hvdkeras.gpu` and
`hvdkeras.engine`.
"""

from hvdkeras.callbacks.best_model import BestModelCheckpoint
from hvdkeras.callbacks.broadcast_global_variables import BroadcastGlobalVariablesCallback
from hvdkeras.callbacks.checkpoint import CheckpointCallback
from hvdkeras.callbacks.data_epochs import DataEpochCallback
from hvdkeras.callbacks.engine_stats import EngineStatsCallback
from hvdkeras.callbacks.gpu_stats import GPUStatsCallback
from hvdkeras.callbacks.learning_rate_schedule import LearningRateScheduleCallback
from hvdkeras.callbacks.learning_rate_warmup import LearningRateWarmupCallback
from hvdkeras.callbacks.metric_average import MetricAverageCallback
from hvdkeras.callbacks.standard import standard_callbacks

__all__ = [
    "BestModelCheckpoint", "BroadcastGlobalVariablesCallback", "CheckpointCallback", "DataEpochCallback",
    "EngineStatsCallback",
    "GPUStatsCallback",
    "LearningRateScheduleCallback",
    "LearningRateWarmupCallback", "MetricAverageCallback", "standard_callbacks",
]

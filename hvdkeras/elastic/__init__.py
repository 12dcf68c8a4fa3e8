"""`hvdkeras.elastic`: Horovod's elastic API (state objects, `run`, callbacks).

Backed by elastic restarts: see hvdkeras/training/elastic_state.py.

What may import it: the top-level package (as `hvdkeras.elastic`).
"""

from hvdkeras.callbacks.elastic_state import (CommitStateCallback, UpdateBatchStateCallback,
                                              UpdateEpochStateCallback)
from hvdkeras.training.elastic_state import (ObjectState, TensorFlowKerasState, TensorFlowState,
                                             run)

KerasState = TensorFlowKerasState  # Horovod's name in horovod.keras.elastic

__all__ = ["CommitStateCallback", "KerasState", "ObjectState", "TensorFlowKerasState",
           "TensorFlowState", "UpdateBatchStateCallback", "UpdateEpochStateCallback", "run"]

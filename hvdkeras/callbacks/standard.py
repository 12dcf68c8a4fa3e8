"""The usual hvdkeras callback list, in the order that makes it correct."""

from __future__ import annotations

from typing import List, Optional, Sequence

import keras

from hvdkeras.callbacks.broadcast_global_variables import BroadcastGlobalVariablesCallback
from hvdkeras.callbacks.checkpoint import CheckpointCallback
from hvdkeras.callbacks.data_epochs import DataEpochCallback
from hvdkeras.callbacks.learning_rate_warmup import LearningRateWarmupCallback
from hvdkeras.callbacks.metric_average import MetricAverageCallback


def standard_callbacks(root_rank: int = 0,
                       warmup_initial_lr: Optional[float] = None,
                       warmup_epochs: int = 5,
                       steps_per_epoch: Optional[int] = None,
                       callbacks: Sequence[keras.callbacks.Callback] = (),
                       checkpoint_dir: Optional[str] = None,
                       keep_last: Optional[int] = 3,
                       save_best_only: bool = False,
                       monitor: str = "val_loss",
                       verbose: int = 0) -> List[keras.callbacks.Callback]:
    """The callbacks for distributed `fit()`, in this order:

    1. `BroadcastGlobalVariablesCallback(root_rank)`: identical start on all
       ranks (and XLA off for the train step).
    2. `MetricAverageCallback()`: epoch metrics averaged before anything
       below reads them, and `DataEpochCallback()`: each epoch's number to
       hvdkeras's `DistributedSampler`s (a new order every epoch).
    3. `LearningRateWarmupCallback` (if `warmup_initial_lr` is given).
    4. Your `callbacks` (e.g. `ReduceLROnPlateau`, `EarlyStopping`): they
       decide from averaged metrics, identically on every rank.
    5. `CheckpointCallback` (if `checkpoint_dir` is given), last, so the
       saved state includes the epoch's decisions.

    Args:
        root_rank: The rank whose initial state everyone starts from.
        warmup_initial_lr: The scaled learning rate to warm up to; None: no
            warmup callback.
        warmup_epochs: For the warmup callback.
        steps_per_epoch: For the warmup callback.
        callbacks: Your own callbacks, placed after the averaging.
        checkpoint_dir: For the checkpoint callback.
        keep_last: For the checkpoint callback.
        save_best_only: For the checkpoint callback.
        monitor: For the checkpoint callback.
        verbose: Passed to the warmup and checkpoint callbacks.

    Returns:
        A new list of callbacks for `fit(callbacks=...)`.

    Example:

    ```python
    model.fit(x, y, epochs=10, initial_epoch=initial_epoch, verbose=hvd.fit_verbose(),
              callbacks=hvd.callbacks.standard_callbacks(
                  warmup_initial_lr=hvd.scale_lr(1e-3), warmup_epochs=2,
                  callbacks=[keras.callbacks.ReduceLROnPlateau(patience=3)],
                  checkpoint_dir="checkpoints"))
    ```
    """
    result: List[keras.callbacks.Callback] = [
        BroadcastGlobalVariablesCallback(root_rank),
        MetricAverageCallback(),
        DataEpochCallback(),
    ]
    if warmup_initial_lr is not None:
        result.append(LearningRateWarmupCallback(warmup_initial_lr, warmup_epochs=warmup_epochs,
                                                 steps_per_epoch=steps_per_epoch, verbose=verbose))
    result.extend(callbacks)
    if checkpoint_dir is not None:
        result.append(CheckpointCallback(checkpoint_dir, keep_last=keep_last,
                                         save_best_only=save_best_only, monitor=monitor,
                                         verbose=verbose))
    return result

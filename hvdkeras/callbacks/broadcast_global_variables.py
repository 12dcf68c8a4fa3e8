"""Every rank starts training from the root rank's model and optimizer state."""

from __future__ import annotations

import keras

from hvdkeras.callbacks._prepare import prepare_model
from hvdkeras.training.model_sync import broadcast_model


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Copies model and optimizer state from `root_rank` before the first step.

    At the start of the first `fit()` the optimizer is built (Keras would
    otherwise create its slots inside step 1) and every model and optimizer
    variable is broadcast from `root_rank`, so all ranks take step 1 from
    identical state, whatever their random initialization or whatever each
    loaded. Later `fit()` calls with the same callback do not broadcast again.

    Like every hvdkeras callback it also turns XLA off for the train step if
    `compile()` turned it on (hvdkeras collectives have no XLA kernel).

    The model must be built before `fit()` (functional models and models
    with a `keras.Input` are; otherwise call `model.build(...)`).

    Args:
        root_rank: The rank whose state is copied to the others.

    Example:

    ```python
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    ```
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self.broadcast_done = False

    def set_model(self, model) -> None:
        super().set_model(model)
        prepare_model(model)

    def on_train_begin(self, logs=None) -> None:
        if self.broadcast_done:
            return
        broadcast_model(self.model, root_rank=self.root_rank)
        self.broadcast_done = True

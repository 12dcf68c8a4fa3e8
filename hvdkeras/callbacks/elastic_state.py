"""Horovod's elastic Keras callbacks: keep an elastic state's position current."""

from __future__ import annotations

import keras

from hvdkeras.training.elastic_state import ObjectState


class CommitStateCallback(keras.callbacks.Callback):
    """Commits `state` every `batches_per_commit` batches and at each epoch end.

    Args:
        state: An `hvdkeras.elastic` state object.
        batches_per_commit: Batches between commits.

    Example:

    ```python
    callbacks = [hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=100)]
    ```
    """

    def __init__(self, state: ObjectState, batches_per_commit: int = 1) -> None:
        super().__init__()
        if not isinstance(batches_per_commit, int) or batches_per_commit < 1:
            raise ValueError(f"batches_per_commit must be an integer >= 1, "
                             f"got {batches_per_commit!r}.")
        self.state = state
        self.batches_per_commit = batches_per_commit
        self._since_commit = 0

    def on_train_batch_end(self, batch, logs=None):
        self._since_commit += 1
        if self._since_commit >= self.batches_per_commit:
            self._since_commit = 0
            self.state.commit()

    def on_epoch_end(self, epoch, logs=None):
        self._since_commit = 0
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps `state.batch` at the number of batches done in this epoch.

    Args:
        state: A state object with a `batch` value.

    Example:

    ```python
    hvd.elastic.UpdateBatchStateCallback(state)
    ```
    """

    def __init__(self, state: ObjectState) -> None:
        super().__init__()
        self.state = state

    def on_train_batch_end(self, batch, logs=None):
        self.state.batch = batch + 1

    def on_epoch_end(self, epoch, logs=None):
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps `state.epoch` at the number of finished epochs.

    Args:
        state: A state object with an `epoch` value.

    Example:

    ```python
    hvd.elastic.UpdateEpochStateCallback(state)
    ```
    """

    def __init__(self, state: ObjectState) -> None:
        super().__init__()
        self.state = state

    def on_epoch_end(self, epoch, logs=None):
        self.state.epoch = epoch + 1

"""Every rank starts training from the root rank's model and optimizer state."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import keras

from hvdkeras.callbacks._prepare import UNBUILT_REASON, prepare_model, turn_off_xla_for_training
from hvdkeras.engine import frameworks
from hvdkeras.training.model_sync import broadcast_model


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Copies model and optimizer state from `root_rank` before the first step.

    At the start of the first `fit()` the optimizer is built (Keras would
    otherwise create its slots inside step 1) and every model and optimizer
    variable is broadcast from `root_rank`, so all ranks take step 1 from
    identical state, whatever their random initialization or whatever each
    loaded. Later `fit()` calls with the same callback do not broadcast again.

    Like every hvdkeras callback it also turns XLA off for the train step on a
    GPU if `compile()` turned it on (there the collectives have no XLA form
    yet), and for a model that `fit()` builds (see below).

    A model that `fit()` itself builds (a `Sequential` without a
    `keras.Input`, as in Horovod's examples) is built and broadcast at the
    start of the first train step, inside the step, before its forward pass:
    the first update is taken from the root's weights on every rank too.

    Args:
        root_rank: The rank whose state is copied to the others.
        device: Accepted for Horovod scripts and not used: hvdkeras places
            its collectives itself.
        local_variables: Variables left out of the broadcast (each rank
            keeps its own: model-parallel layers).

    Example:

    ```python
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    ```
    """

    def __init__(self, root_rank: int = 0, device: str = "",
                 local_variables: Optional[Sequence[Any]] = None) -> None:
        super().__init__()
        self.root_rank = int(root_rank)
        self.device = device
        self.local_variables = list(local_variables or [])
        self.broadcast_done = False

        self._in_step: Optional[Any] = None  # a tf.Variable: set in the step

    def set_model(self, model) -> None:
        super().set_model(model)
        prepare_model(model)
        # fit() makes its train function after set_model and before
        # on_train_begin, so this is the last moment to put the broadcast
        # into the step of a model that is not built yet.
        if not self.broadcast_done and not getattr(model, "built", False) \
                and self._in_step is None \
                and frameworks.keras_backend() == frameworks.TENSORFLOW:
            turn_off_xla_for_training(model, UNBUILT_REASON)
            self._broadcast_in_first_step(model)

    def _broadcast_in_first_step(self, model: Any) -> None:
        import tensorflow as tf  # lazy: this step is TensorFlow's (set_model checks)

        from hvdkeras.collectives.broadcasting import broadcast_variables  # lazy: as above

        done = tf.Variable(False, trainable=False, name="hvdkeras_broadcast_done")
        self._in_step = done
        step = model.train_step
        root = self.root_rank
        kept = {id(v) for v in self.local_variables}

        def train_step(data):
            if not model.built:  # while the step is traced: create the variables now
                x = keras.utils.unpack_x_y_sample_weight(data)[0]
                if isinstance(x, tf.Tensor):
                    model.build(x.shape)
                else:
                    model(x, training=False)

            def broadcast():
                broadcast_variables([v for v in model.variables if id(v) not in kept],
                                    root_rank=root, name="hvdkeras_first_step_broadcast")
                done.assign(True)
                return tf.constant(True)

            ready = tf.cond(done, lambda: tf.constant(True), broadcast)
            with tf.control_dependencies([ready]):
                return step(data)

        model.train_step = train_step

    def on_train_begin(self, logs=None) -> None:
        if self.broadcast_done or self._in_step is not None:
            return
        broadcast_model(self.model, root_rank=self.root_rank, exclude=self.local_variables)
        self.broadcast_done = True

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self._in_step is not None and not self.broadcast_done:
            self.broadcast_done = bool(self._in_step.numpy())

    def on_train_end(self, logs=None) -> None:
        if self._in_step is not None:
            # The plain step again for later fit() calls (its flag is set anyway).
            vars(self.model).pop("train_step", None)
            self._in_step = None

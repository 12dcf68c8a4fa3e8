"""Batch normalization over the whole global batch (Horovod's
`SyncBatchNormalization`), under every Keras backend.

What may import this module: the top-level package. It loads no framework
itself: the statistics are `keras.ops`, and the one allreduce is the running
backend's (TensorFlow's op, or the torch and JAX bindings', each with its
gradient).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

import keras

from hvdkeras.backends import dispatch
from hvdkeras.engine import frameworks, world
from hvdkeras.engine.types import Sum


def _allreduce() -> Callable[..., Any]:
    """The running backend's allreduce (imported on first use: it loads the framework)."""
    if frameworks.keras_backend() == frameworks.TENSORFLOW:
        return importlib.import_module("hvdkeras.collectives.reduction").allreduce
    return dispatch.backend_function("allreduce")


@keras.saving.register_keras_serializable(package="hvdkeras")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` whose training statistics cover every rank's batch.

    In training, the mean and variance are those of the global batch (the
    batches of all ranks together), as one process training on the global
    batch computes them, under TensorFlow, JAX and torch. Each rank sums its
    rows' values and squares, one allreduce per layer and step adds the sums
    over ranks (ranks may hold different numbers of rows; a `mask` weights
    the rows), and the moving averages follow the global statistics, so they
    stay identical on every rank and rank 0's checkpoint holds everyone's.
    Gradients flow through the allreduce. At inference, and on one rank, it
    is the plain layer. Small per-rank batches (detection, segmentation) are
    where this matters.

    Takes every argument of `keras.layers.BatchNormalization` except
    `renorm` and `synchronized` (Keras' own cross-replica option for
    `tf.distribute`, which hvdkeras replaces).

    Example:

    ```python
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(16, 3),
                              hvd.SyncBatchNormalization(), keras.layers.ReLU()])
    ```
    """

    def __init__(self, **kwargs: Any) -> None:
        for unsupported in ("renorm", "synchronized"):
            if kwargs.get(unsupported):
                raise ValueError(f"SyncBatchNormalization does not take {unsupported}=True: it "
                                 "synchronizes through hvdkeras; use the plain arguments.")
        # Keras 2's fused kernel: Horovod's layer forced it off, and Keras 3
        # has no such argument, so False (or None) is accepted and dropped.
        if kwargs.pop("fused", None):
            raise ValueError("SyncBatchNormalization has no fused kernel; drop fused=True.")
        super().__init__(**kwargs)

    def _reduced_axes(self, rank: int) -> list:
        kept = [a % rank for a in (self.axis if isinstance(self.axis, (list, tuple))
                                   else [self.axis])]
        return [i for i in range(rank) if i not in kept]

    def _global_moments(self, inputs: Any, mask: Optional[Any]):
        """The global batch's mean and variance, in the moving statistics' shape.

        The sums are taken around the moving mean, which is the same on
        every rank (it follows the global statistics from the same start), so
        the variance keeps its precision once that mean is near the batch's.
        """
        ops = keras.ops
        axes = self._reduced_axes(len(inputs.shape))
        shift = ops.stop_gradient(ops.cast(self.moving_mean, inputs.dtype))
        kept_shape = [1 if i in axes else inputs.shape[i] for i in range(len(inputs.shape))]
        centred = inputs - ops.reshape(shift, kept_shape)
        if mask is None:
            weights = ops.ones_like(inputs)
        else:
            weights = ops.broadcast_to(ops.cast(ops.expand_dims(mask, -1), inputs.dtype),
                                       ops.shape(inputs))
        local = ops.concatenate([
            ops.reshape(ops.sum(weights * centred, axes), [-1]),
            ops.reshape(ops.sum(weights * ops.square(centred), axes), [-1]),
            ops.reshape(ops.sum(weights, axes), [-1])], axis=0)
        total = _allreduce()(local, op=Sum, name=f"hvdkeras_sync_bn_{self.name}")
        total_sum, total_squares, count = ops.split(total, 3)
        count = ops.maximum(count, 1.0)
        offset = total_sum / count
        variance = ops.maximum(total_squares / count - ops.square(offset), 0.0)
        shape = self.moving_mean.shape  # the kept axes' sizes
        return ops.reshape(shift + offset, shape), ops.reshape(variance, shape)

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable) or world.size() == 1:
            return super().call(inputs, training=training, mask=mask)
        ops = keras.ops
        x = ops.cast(inputs, "float32")  # as the plain layer computes, for float16 inputs too
        mean, variance = self._global_moments(x, mask)
        self.moving_mean.assign(self.moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(
            self.moving_variance * self.momentum + variance * (1.0 - self.momentum))
        outputs = ops.batch_normalization(
            x=x, mean=mean, variance=variance, axis=self.axis,
            offset=self.beta if self.center else None,
            scale=self.gamma if self.scale else None, epsilon=self.epsilon)
        return ops.cast(outputs, self.compute_dtype)

"""Batch normalization over the whole global batch (Horovod's `SyncBatchNormalization`).

What may import this module: the top-level package (it imports TensorFlow).
"""

from __future__ import annotations

from typing import Any, Optional

import keras
import tensorflow as tf

from hvdkeras.collectives.reduction import allreduce
from hvdkeras.engine import world
from hvdkeras.engine.types import Sum


@keras.saving.register_keras_serializable(package="hvdkeras")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` whose training statistics cover every rank's batch.

    In training, the mean and variance are those of the global batch (the
    batches of all ranks together), as one process training on the global
    batch would compute them: each rank sums its rows' values and squares,
    one allreduce adds the sums over ranks (ranks may hold different numbers
    of rows; a `mask` weights the rows), and the moving averages follow the
    global statistics, so they stay identical on every rank. Gradients flow
    through the allreduce. At inference it is the plain layer. Small
    per-rank batches (detection, segmentation) are where this matters.

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

    def _global_moments(self, inputs: tf.Tensor, mask: Optional[tf.Tensor]):
        axes = self._reduced_axes(len(inputs.shape))
        if mask is None:
            weights = tf.ones_like(inputs)
        else:
            weights = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), inputs.dtype),
                                      tf.shape(inputs))
        local = tf.concat([tf.reshape(tf.reduce_sum(weights * inputs, axes), [-1]),
                           tf.reshape(tf.reduce_sum(weights * tf.square(inputs), axes), [-1]),
                           tf.reshape(tf.reduce_sum(weights, axes), [-1])], axis=0)
        total = allreduce(local, op=Sum, name=f"hvdkeras_sync_bn_{self.name}")
        total_sum, total_squares, count = tf.split(total, 3)
        count = tf.maximum(count, 1.0)
        mean = total_sum / count
        variance = tf.maximum(total_squares / count - tf.square(mean), 0.0)
        shape = self.moving_mean.shape  # the kept axes' sizes
        return tf.reshape(mean, shape), tf.reshape(variance, shape)

    def call(self, inputs, training=None, mask=None):
        if not (training and self.trainable) or world.size() == 1:
            return super().call(inputs, training=training, mask=mask)
        x = tf.cast(inputs, "float32")  # as the plain layer computes, for float16 inputs too
        mean, variance = self._global_moments(x, mask)
        self.moving_mean.assign(self.moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(
            self.moving_variance * self.momentum + variance * (1.0 - self.momentum))
        outputs = keras.ops.batch_normalization(
            x=x, mean=mean, variance=variance, axis=self.axis,
            offset=self.beta if self.center else None,
            scale=self.gamma if self.scale else None, epsilon=self.epsilon)
        return keras.ops.cast(outputs, self.compute_dtype)

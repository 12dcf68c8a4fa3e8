"""Local gradient accumulation for `backward_passes_per_step`.

The accumulators are deliberately not optimizer variables: a `.keras` file
saved with accumulation on holds exactly the variables of the plain optimizer,
so it loads into the plain optimizer (with or without hvdkeras). The cost is
that a partly filled accumulation window is not checkpointed.

What may import this module: `hvdkeras.training.optimizer`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import keras
import tensorflow as tf


class LocalGradientAccumulator:
    """Sums gradients over `passes` calls, then hands them out once.

    Args:
        passes: Number of backward passes per optimizer update (>= 2).
        average: Divide the summed gradients by `passes` before handing
            them out (Horovod's `average_aggregated_gradients`).
    """

    def __init__(self, passes: int, average: bool) -> None:
        self.passes = passes
        self.average = average
        self.sums: List[keras.Variable] = []
        self.counter: Optional[keras.Variable] = None
        self._positions: dict = {}

    @property
    def built(self) -> bool:
        return self.counter is not None

    def build(self, variables: Sequence) -> None:
        """Creates one zero accumulator per variable, plus the pass counter."""
        with tf.init_scope():
            self.sums = [
                keras.Variable(initializer="zeros", shape=v.shape, dtype=v.dtype,
                               trainable=False, name="hvdkeras_accumulated_gradient")
                for v in variables
            ]
            self.counter = keras.Variable(0, dtype="int64", trainable=False,
                                          name="hvdkeras_backward_passes")
        self._positions = {id(v): i for i, v in enumerate(variables)}

    def position(self, variable) -> int:
        """The accumulator index of `variable` (one the accumulator was built for)."""
        try:
            return self._positions[id(variable)]
        except KeyError:
            raise ValueError(
                f"Variable {getattr(variable, 'path', variable)!r} was not among the variables "
                "the optimizer was built with; backward_passes_per_step needs the same "
                "trainable variables on every call."
            ) from None

    def add(self, gradients: Sequence, positions: Sequence[int]) -> tf.Tensor:
        """Adds `gradients` (None skipped) to the accumulators at `positions`.

        Returns:
            A boolean tensor: whether this pass completes a window.
        """
        for gradient, position in zip(gradients, positions):
            if gradient is None:
                continue
            if isinstance(gradient, tf.IndexedSlices):
                gradient = tf.convert_to_tensor(gradient)
            self.sums[position].assign_add(tf.cast(gradient, self.sums[position].dtype))
        count = self.counter.assign_add(1)
        return tf.equal(tf.math.floormod(count, self.passes), 0)

    def values(self, positions: Sequence[int]) -> List[tf.Tensor]:
        """The accumulated gradients at `positions` (averaged if configured)."""
        out = []
        for position in positions:
            total = tf.convert_to_tensor(self.sums[position])
            out.append(total / self.passes if self.average else total)
        return out

    def reset(self, positions: Sequence[int]) -> None:
        """Zeroes the accumulators at `positions`."""
        for position in positions:
            self.sums[position].assign(tf.zeros_like(self.sums[position]))

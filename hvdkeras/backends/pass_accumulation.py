"""hvdkeras's own gradient accumulation for `backward_passes_per_step` with
sharded optimizer state under torch.

Without sharding, torch and JAX accumulate with Keras's own
`gradient_accumulation_steps` and reduce on the update pass. With sharding
Keras's accumulators cannot serve: the sharded optimizer is built on
stand-ins for the variables other ranks own, and a rank must still send
its whole accumulated gradient to those owners. So every rank keeps a
full-size sum of its own passes here, outside the optimizer's variables
(as TensorFlow's `hvdkeras.training.local_accumulation` does: a saved file
holds the plain optimizer's state, and a window cut short by a restart is
not saved). Under torch the step runs eagerly, so the sums are plain
tensors and the window a Python count (JAX's jitted step keeps them as
optimizer variables instead: `jax/pass_window`).

What may import this module: `hvdkeras.backends.optimizer`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

import keras


class PassAccumulator:
    """Sums each variable's gradients over `passes` calls, then hands out the
    window's total once.

    Args:
        passes: Backward passes per optimizer update (>= 2).
        average: Hand out the mean of the passes instead of their sum
            (Horovod's `average_aggregated_gradients`).

    Example:

    ```python
    accumulator = PassAccumulator(passes=2, average=False)
    if accumulator.add(grads, variables):      # True on the window's last pass
        summed = accumulator.take(variables)
    ```
    """

    def __init__(self, passes: int, average: bool) -> None:
        self.passes = passes
        self.average = average
        self.count = 0
        self._sums: Dict[int, Any] = {}

    def add(self, grads: Sequence[Any], variables: Sequence[Any]) -> bool:
        """Adds one pass's gradients (None skipped); True when the pass
        completes a window."""
        for gradient, variable in zip(grads, variables):
            if gradient is None:
                continue
            key = id(variable)
            total = self._sums.get(key)
            # A copy on the first pass: the framework may reuse the
            # gradient's memory in the next backward pass.
            self._sums[key] = keras.ops.copy(gradient) if total is None else total + gradient
        self.count += 1
        return self.count % self.passes == 0

    def build(self, holder: Any) -> None:
        """Nothing to add to the optimizer: the sums live here."""

    def window(self, grads: Sequence[Any], variables: Sequence[Any],
               apply_total: Callable[[List[Optional[Any]]], Any]) -> Any:
        """Adds one pass; on a window's last pass returns `apply_total` of
        the window's gradients (in the order of `variables`), else None."""
        if not self.add(grads, variables):
            return None
        return apply_total(self.take(variables))

    def take(self, variables: Sequence[Any]) -> List[Optional[Any]]:
        """The window's gradients in the order of `variables` (None for a
        variable no pass had a gradient for), and a fresh window."""
        sums, self._sums = self._sums, {}
        out = [sums.get(id(v)) for v in variables]
        if self.average:
            out = [None if g is None else g / self.passes for g in out]
        return out

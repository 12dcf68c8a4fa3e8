"""`backward_passes_per_step` with sharded optimizer state under JAX.

Each rank sums its own passes in full-size buffers and hands the window's
total to the sharded step once, as `pass_accumulation.PassAccumulator`
does under torch. Keras's JAX trainer jits the whole step and carries only
the optimizer's variables from one step to the next, so here the sums and
the pass count are optimizer variables (scratch: Note [scratch variables
are not state] in `hvdkeras/sharding/state.py`), and the update is a
`lax.cond` on the pass count: the passes that do not end a window move no
bytes and leave the weights and the optimizer's state as they were. Every
rank counts the same passes, so every rank takes the same branch.

What may import this module: `hvdkeras.backends.optimizer` (under JAX only).
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import jax
import jax.numpy as jnp

from hvdkeras.backends.sharded_optimizer import run_stateless


class TracedPassWindow:
    """Sums each variable's gradients over `passes` traced steps, then runs
    the sharded update on the window's total once.

    Args:
        passes: How many traced steps make one window (>= 2).
        average: Apply the window's mean rather than its total.

    Example:

    ```python
    window = TracedPassWindow(passes=2, average=False)
    window.build(holder)           # once, after the sharded optimizer is built
    window.window(grads, variables, apply_total)   # inside the jitted step
    ```
    """

    def __init__(self, passes: int, average: bool) -> None:
        self.passes = passes
        self.average = average
        self._holder: Optional[Any] = None
        self._sums: List[Any] = []
        self._count: Optional[Any] = None

    def build(self, holder: Any) -> None:
        """Adds the sums (one per model variable, full size on every rank)
        and the pass count to `holder`, the built sharded optimizer."""
        if self._holder is not None:
            return
        state = holder._hvdkeras_shards
        shapes = [tuple(v.shape) for v in state.variables]
        dtypes = [v.dtype for v in state.variables]
        self._sums = state.add_scratch(holder, shapes, dtypes, "hvdkeras_pass_sum")
        self._count = state.add_scratch(holder, [()], ["int32"], "hvdkeras_pass_count")[0]
        self._holder = holder

    def window(self, grads: Sequence[Any], variables: Sequence[Any],
               apply_total: Callable[[List[Any]], Any]) -> None:
        """Adds one pass's gradients; on a window's last pass calls
        `apply_total` with the window's gradients, in the order of
        `variables`, inside a `lax.cond` branch.

        Runs inside the step's `keras.StatelessScope` (the sharded
        optimizer's `stateless_apply`), whose values it reads and assigns.
        A variable without a gradient adds zeros (Keras's JAX trainer gives
        every trainable variable one).
        """
        holder = self._holder
        if holder is None:
            raise RuntimeError("hvdkeras: the pass window was used before its optimizer was built.")
        state = holder._hvdkeras_shards
        totals = [s.value for s in self._sums]
        for gradient, variable in zip(grads, variables):
            if gradient is not None:
                p = state.position(variable)
                totals[p] = totals[p] + gradient.astype(totals[p].dtype)
        count = self._count.value + 1
        is_update = count % self.passes == 0
        model_variables = list(state.variables)
        optimizer_variables = list(holder.variables)

        def update(model_values, optimizer_values, window_totals):
            if self.average:
                window_totals = [t / self.passes for t in window_totals]
            return run_stateless(
                model_variables, model_values, optimizer_variables, optimizer_values,
                lambda: apply_total([window_totals[state.position(v)] for v in variables]))

        def keep(model_values, optimizer_values, window_totals):
            return list(model_values), list(optimizer_values)

        new_model, new_optimizer = jax.lax.cond(
            is_update, update, keep, [v.value for v in model_variables],
            [v.value for v in optimizer_variables], totals)
        for variable, value in zip(model_variables, new_model):
            variable.assign(value)
        for variable, value in zip(optimizer_variables, new_optimizer):
            variable.assign(value)
        for total, variable in zip(totals, self._sums):
            variable.assign(jnp.where(is_update, jnp.zeros_like(total), total))
        self._count.assign(count)

"""Where Keras's JAX trainer meets weights sharded at `zero_stage=3` (Note
[sharded parameters under JAX] in `parameters`): the step's state carries
each sharded weight's rows, and the model runs on whole values gathered
from them inside the step.

Keras's trainer (3.15) collects a step's state in `_get_jax_state`, runs
the model in `compute_loss_and_updates` (training and evaluation) and
`predict_step`, and writes the state back with `variable.assign`. The three
methods are wrapped once, on Keras's `JAXTrainer` class, when a sharded
optimizer under JAX is first built; for a model without sharded weights the
wrappers only check its variables' classes and call Keras's own methods.

What may import this module: `hvdkeras.backends.jax.parameters`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, List, Sequence

from hvdkeras import compat

_installed = threading.Lock()
_done = False
_rows = threading.local()
METHODS = ("_get_jax_state", "compute_loss_and_updates", "predict_step")


@contextlib.contextmanager
def reading_rows() -> Iterator[None]:
    """Inside, sharded variables answer reads with this rank's rows (the
    trainer collecting a step's state)."""
    previous = getattr(_rows, "active", False)
    _rows.active = True
    try:
        yield
    finally:
        _rows.active = previous


def rows_being_read() -> bool:
    """Whether a read now is the trainer collecting a step's state."""
    return getattr(_rows, "active", False)


def install() -> None:
    """Wraps the trainer's methods (once per process).

    Raises:
        RuntimeError: if this Keras release's JAX trainer lacks one of them.
    """
    global _done
    with _installed:
        if _done:
            return
        cls = compat.keras_jax_trainer_class()
        missing = [m for m in METHODS if not hasattr(cls, m)]
        if missing:
            raise RuntimeError(
                f"zero_stage=3 under JAX needs Keras's JAXTrainer methods {missing}, which "
                "this Keras release does not have (checked on Keras 3.15); use zero_stage=2, "
                "or the TensorFlow or torch backend.")
        cls._get_jax_state = _state_of_rows(cls._get_jax_state)
        cls.compute_loss_and_updates = _run_on_whole(cls.compute_loss_and_updates)
        cls.predict_step = _predict_on_whole(cls.predict_step)
        _done = True


def _state_of_rows(original: Callable) -> Callable:
    @functools.wraps(original)
    def _get_jax_state(self, *args, **kwargs):
        with reading_rows():
            return original(self, *args, **kwargs)

    return _get_jax_state


def _run_on_whole(original: Callable) -> Callable:
    @functools.wraps(original)
    def compute_loss_and_updates(self, trainable_variables, *args, **kwargs):
        return original(self, whole_values(self.trainable_variables, trainable_variables),
                        *args, **kwargs)

    return compute_loss_and_updates


def _predict_on_whole(original: Callable) -> Callable:
    @functools.wraps(original)
    def predict_step(self, state, data):
        trainable, non_trainable = state
        return original(self, (whole_values(self.trainable_variables, trainable),
                               non_trainable), data)

    return predict_step


def whole_values(variables: Sequence[Any], values: Sequence[Any]) -> List[Any]:
    """`values` (the step's values of `variables`) with each sharded
    weight's rows replaced by its whole value, gathered in the step."""
    values = list(values)
    if len(values) != len(variables):
        return values  # not the model's own state: Keras's checks report it
    by_owner: dict = {}
    for index, variable in enumerate(variables):
        owner = getattr(variable, "_hvdkeras_parameters", None)
        if hasattr(owner, "whole_for_step"):  # JAX's sharded weights
            by_owner.setdefault(id(owner), (owner, {}))[1][
                owner.state.position(variable)] = index
    for owner, indices in by_owner.values():
        wholes = owner.whole_for_step({p: values[i] for p, i in indices.items()})
        for p, i in indices.items():
            values[i] = wholes[p]
    return values

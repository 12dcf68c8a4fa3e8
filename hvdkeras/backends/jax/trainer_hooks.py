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

What may import this module: `hvdkeras.backends.jax.parameters` (lazily).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Sequence

from hvdkeras.backends.jax import parameters as jax_parameters

_installed = threading.Lock()
_done = False
METHODS = ("_get_jax_state", "compute_loss_and_updates", "predict_step")


def install() -> None:
    """Wraps the trainer's methods (once per process).

    Raises:
        RuntimeError: if this Keras release's JAX trainer lacks one of them.
    """
    global _done
    with _installed:
        if _done:
            return
        # Lazy: Keras's JAX trainer, present under that backend only.
        from keras.src.backend.jax import trainer

        missing = [m for m in METHODS if not hasattr(trainer.JAXTrainer, m)]
        if missing:
            raise RuntimeError(
                f"zero_stage=3 under JAX needs Keras's JAXTrainer methods {missing}, which "
                "this Keras release does not have (checked on Keras 3.15); use zero_stage=2, "
                "or the TensorFlow or torch backend.")
        cls = trainer.JAXTrainer
        cls._get_jax_state = _state_of_rows(cls._get_jax_state)
        cls.compute_loss_and_updates = _run_on_whole(cls.compute_loss_and_updates)
        cls.predict_step = _predict_on_whole(cls.predict_step)
        _done = True


def _state_of_rows(original: Callable) -> Callable:
    @functools.wraps(original)
    def _get_jax_state(self, *args, **kwargs):
        with jax_parameters.reading_rows():
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
        if isinstance(owner, jax_parameters.JaxShardedParameters):
            by_owner.setdefault(id(owner), (owner, {}))[1][
                owner.state.position(variable)] = index
    for owner, indices in by_owner.values():
        wholes = owner.whole_for_step({p: values[i] for p, i in indices.items()})
        for p, i in indices.items():
            values[i] = wholes[p]
    return values

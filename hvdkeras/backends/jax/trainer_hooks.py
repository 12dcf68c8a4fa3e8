"""Where Keras's JAX trainer meets weights sharded at `zero_stage=3` (Note
[sharded parameters under JAX] in `parameters`): the step's state carries
each sharded weight's rows, and the model runs on whole values gathered
from them inside the step.

Keras's trainer (3.15) collects a step's state in `_get_jax_state`, runs
the model in `compute_loss_and_updates` (training and evaluation) or
`stateless_call` (prediction, and custom steps), and writes the state back
with `variable.assign`. Those methods and the three step methods are
wrapped once, on Keras's `JAXTrainer` class, when a sharded optimizer under
JAX is first built, and a model class's own overrides of them (Keras's
guide to customising `fit` under JAX) when Keras first makes its step
function; for a model without sharded weights the wrappers only check its
variables' classes and call the methods they wrap.

What may import this module: `hvdkeras.backends.jax.parameters`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Iterator, Sequence

import keras

from hvdkeras import compat

_installed = threading.Lock()
_done = False
_rows = threading.local()
_flags = threading.local()
WRAPPED = "_hvdkeras_stage_three"
STEPS = ("train_step", "test_step", "predict_step")
MAKERS = ("make_train_function", "make_test_function", "make_predict_function")


def reading_rows() -> contextlib.AbstractContextManager:
    """Inside, sharded variables answer reads with this rank's rows (the
    trainer collecting a step's state)."""
    return _raised(_rows, "active")


def rows_being_read() -> bool:
    """Whether a read now is the trainer collecting a step's state."""
    return getattr(_rows, "active", False)


@contextlib.contextmanager
def _raised(holder: threading.local, name: str) -> Iterator[None]:
    previous = getattr(holder, name, False)
    setattr(holder, name, True)
    try:
        yield
    finally:
        setattr(holder, name, previous)


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
        # A model's `stateless_call` is Layer's (JAXTrainer sits before Layer
        # in a model's classes, so the wrapper set on it is the one found).
        sources = {name: cls if hasattr(cls, name) else keras.layers.Layer
                   for name in _WRAPPERS}
        missing = [m for m in ("_get_jax_state", *MAKERS, *_WRAPPERS)
                   if not hasattr(sources.get(m, cls), m)]
        if missing:
            raise RuntimeError(
                f"zero_stage=3 under JAX needs Keras's JAXTrainer methods {missing}, which "
                "this Keras release does not have (checked on Keras 3.15); use zero_stage=2, "
                "or the TensorFlow or torch backend.")
        cls._get_jax_state = _state_of_rows(cls._get_jax_state)
        for name in MAKERS:
            setattr(cls, name, _overrides_first(getattr(cls, name), cls))
        for name, wrap in _WRAPPERS.items():
            setattr(cls, name, wrap(getattr(sources[name], name)))
        _done = True


def _state_of_rows(original: Callable) -> Callable:
    @functools.wraps(original)
    def _get_jax_state(self, *args, **kwargs):
        with reading_rows():
            return original(self, *args, **kwargs)

    return _get_jax_state


def _overrides_first(original: Callable, trainer_class: type) -> Callable:
    """`make_train_function` and its kin: Keras takes the step method when
    it makes the function, and every trainer entry point makes it before it
    collects the state or runs a step."""
    @functools.wraps(original)
    def make_function(self, *args, **kwargs):
        if _has_sharded_weights(self):
            _wrap_overrides(type(self), trainer_class)
        return original(self, *args, **kwargs)

    return make_function


def _wrap_overrides(model_class: type, trainer_class: type) -> None:
    """Wraps a subclass's own `train_step`, `compute_loss_and_updates` and
    the like, as Keras's are: the model a user customises the way Keras's
    JAX guide shows still runs on whole weights and marks its steps. Runs
    before Keras takes a step method (when it makes the step's function)."""
    for klass in model_class.__mro__:
        if klass is trainer_class:
            return
        for name, wrap in _WRAPPERS.items():
            method = klass.__dict__.get(name)
            if inspect.isfunction(method) and not getattr(method, WRAPPED, False):
                setattr(klass, name, wrap(method))


def _sharded_owner(variable: Any) -> Any:
    """The JAX sharded weights `variable` belongs to, or None."""
    owner = getattr(variable, "_hvdkeras_parameters", None)
    return owner if hasattr(owner, "whole_for_step") else None


def _has_sharded_weights(model: Any) -> bool:
    return any(_sharded_owner(v) is not None for v in getattr(model, "trainable_variables", ()))


def _marked(wrapper: Callable) -> Callable:
    setattr(wrapper, WRAPPED, True)
    return wrapper


def _a_step(original: Callable) -> Callable:
    """`train_step`, `test_step` and `predict_step`: their state holds rows,
    so a `stateless_call` inside them gathers the whole weights."""
    @functools.wraps(original)
    def step(self, *args, **kwargs):
        with _raised(_flags, "step"):
            return original(self, *args, **kwargs)

    return _marked(step)


def _on_whole(original: Callable, only_in_a_step: bool) -> Callable:
    """A method whose first argument is the trainable variables' values:
    called with rows, it runs on the whole weights, gathered in the step.
    Nested calls (Keras's `compute_loss_and_updates` calling
    `stateless_call`, an override calling `super()`) gather once."""
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        if getattr(_flags, "whole", False) or (
                only_in_a_step and not getattr(_flags, "step", False)):
            return original(self, *args, **kwargs)
        if args:
            args = (whole_values(self.trainable_variables, args[0]), *args[1:])
        elif "trainable_variables" in kwargs:
            kwargs = {**kwargs, "trainable_variables": whole_values(
                self.trainable_variables, kwargs["trainable_variables"])}
        with _raised(_flags, "whole"):
            return original(self, *args, **kwargs)

    return _marked(method)


# What each wrapped trainer method becomes. `compute_loss_and_updates` is
# always given rows (the trainer's state, or a custom train_step's); a
# model's `stateless_call` gets rows only inside a step (outside, a user
# passes values read from the variables, which are whole).
_WRAPPERS = {
    "compute_loss_and_updates": functools.partial(_on_whole, only_in_a_step=False),
    "stateless_call": functools.partial(_on_whole, only_in_a_step=True),
    **{name: _a_step for name in STEPS},
}


def whole_values(variables: Sequence[Any], values: Sequence[Any]) -> Sequence[Any]:
    """`values` (the step's values of `variables`) with each sharded
    weight's rows replaced by its whole value, gathered in the step."""
    if len(values) != len(variables):
        return values  # not the model's own state: Keras's checks report it
    by_owner: dict = {}
    for index, variable in enumerate(variables):
        owner = _sharded_owner(variable)
        if owner is not None:
            by_owner.setdefault(id(owner), (owner, {}))[1][
                owner.state.position(variable)] = index
    if not by_owner:
        return values
    values = list(values)
    for owner, indices in by_owner.values():
        wholes = owner.whole_for_step({p: values[i] for p, i in indices.items()})
        for p, i in indices.items():
            values[i] = wholes[p]
    return values

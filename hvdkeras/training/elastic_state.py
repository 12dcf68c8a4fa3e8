"""Horovod's elastic state objects, backed by hvdkeras's elastic restarts.

Horovod keeps a job alive through a lost worker by rolling the survivors
back to the last `state.commit()`. hvdkeras is elastic by restarting the job
on the ranks that remain (hvdkeras/runner/elastic.py), so a commit must
outlive the processes: with `HVDKERAS_ELASTIC_STATE_DIR` set, rank 0 also
writes each commit there (atomically), and `run` starts from it, broadcast
to the new world. Without it, commits live in memory only, which serves
`state.restore()` within a process but not a restart.

What may import this module: `hvdkeras.elastic` and the callbacks.
"""

from __future__ import annotations

import copy
import functools
import os
import pickle
from typing import Any, Callable, Dict, List, Optional, Sequence

from hvdkeras.collectives.broadcasting import broadcast_variables
from hvdkeras.engine import world
from hvdkeras.engine.config import ELASTIC_STATE_DIR as STATE_DIR
from hvdkeras.host.objects import broadcast_object
from hvdkeras.sharding.sharded_optimizer import everywhere_variables
from hvdkeras.training.checkpoint_writing import write_bytes_atomic

STATE_FILE = "elastic-state.pkl"


class ObjectState:
    """Picklable values kept across failures: `state.epoch`, `state.batch`, ...

    Args:
        **kwargs: The values, each becoming an attribute.

    Example:

    ```python
    state = hvd.elastic.ObjectState(epoch=0, batch=0)
    state.epoch += 1
    state.commit()
    ```
    """

    def __init__(self, **kwargs: Any) -> None:
        self._known = dict(kwargs)
        self._reset_callbacks: List[Callable[[], None]] = []
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved: Dict[str, Any] = {}
        self.save()

    def register_reset_callbacks(self, callbacks: Sequence[Callable[[], None]]) -> None:
        """Functions called after the state was restored on a reset."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def _values(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._known}

    def save(self) -> None:
        """Keeps a copy of the current values in memory."""
        self._saved = {"values": copy.deepcopy(self._values())}

    def restore(self) -> None:
        """Returns to the last saved values."""
        for name, value in copy.deepcopy(self._saved["values"]).items():
            setattr(self, name, value)

    def sync(self) -> None:
        """Makes every rank hold rank 0's values (collective)."""
        values = broadcast_object(self._values() if world.rank() == 0 else None, 0,
                                  name="HvdkerasElasticState")
        for name, value in values.items():
            setattr(self, name, value)
        self.save()

    def check_host_updates(self) -> None:
        """Hosts change by restarting the job in hvdkeras: nothing to check in place."""

    def commit(self) -> None:
        """Saves the state; with `HVDKERAS_ELASTIC_STATE_DIR`, rank 0 also writes it.

        Refused once the engine has stopped on an error: the state may then
        hold a step some ranks did not finish (a GPU batch cut short), and
        the last commit stays the one a restarted job resumes from.
        """
        if world.engine_stopped():
            raise RuntimeError(
                "hvdkeras: not committing the elastic state: hvdkeras stopped on an error "
                "(see the error of the collective that failed), so this state may hold partial "
                "results; the last commit is kept for the restarted job to resume from")
        self.save()
        directory = os.environ.get(STATE_DIR)
        if directory and world.rank() == 0:
            os.makedirs(directory, exist_ok=True)
            write_bytes_atomic(os.path.join(directory, STATE_FILE), pickle.dumps(self._saved))
        self.check_host_updates()

    def _load_committed(self) -> bool:
        """Rank 0: the last written commit, if any, becomes the saved state."""
        directory = os.environ.get(STATE_DIR)
        path = os.path.join(directory, STATE_FILE) if directory else ""
        if world.rank() != 0 or not path or not os.path.exists(path):
            return False
        with open(path, "rb") as f:
            self._saved = pickle.load(f)
        self.restore()
        return True


class TensorFlowState(ObjectState):
    """`ObjectState` plus TensorFlow variables, saved by value.

    Args:
        variables: The `tf.Variable`s (or Keras variables) to keep.
        **kwargs: Other values, as in `ObjectState`.

    Example:

    ```python
    state = hvd.elastic.TensorFlowState(model.variables, epoch=0)
    ```
    """

    def __init__(self, variables: Optional[Sequence] = None, **kwargs: Any) -> None:
        self.variables = list(variables or [])
        super().__init__(**kwargs)

    def save(self) -> None:
        super().save()
        self._saved["variables"] = [v.numpy() for v in self.variables]

    def restore(self) -> None:
        super().restore()
        for v, value in zip(self.variables, self._saved.get("variables", [])):
            v.assign(value)

    def sync(self) -> None:
        if self.variables:
            broadcast_variables(self.variables, root_rank=0, name="HvdkerasElasticVariables")
        super().sync()


class TensorFlowKerasState(TensorFlowState):
    """`ObjectState` plus a Keras model's and optimizer's variables.

    Args:
        model: The Keras model (built).
        optimizer: Its optimizer (default `model.optimizer`), built or not.
        **kwargs: Other values, such as `epoch=0, batch=0`.

    Example:

    ```python
    state = hvd.elastic.TensorFlowKerasState(model, epoch=0, batch=0)
    ```
    """

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        super().__init__(self._all_variables(), **kwargs)

    def _all_variables(self) -> list:
        optimizer_variables = list(getattr(self.optimizer, "variables", []) or [])
        return list(self.model.variables) + optimizer_variables

    def save(self) -> None:
        self.variables = self._all_variables()  # the optimizer builds its slots late
        super().save()

    def sync(self) -> None:
        # A sharded optimizer's slots differ per rank by design: only what
        # every rank holds alike travels.
        self.variables = self._all_variables()
        broadcast_variables(list(self.model.variables) + everywhere_variables(self.optimizer),
                            root_rank=0, name="HvdkerasElasticVariables")
        ObjectState.sync(self)


def run(func: Callable) -> Callable:
    """Horovod's `elastic.run`: start `func(state, ...)` from the last commit.

    The wrapped function's first argument is the state. Before calling it,
    the last commit written to `HVDKERAS_ELASTIC_STATE_DIR` (if any) is
    loaded on rank 0 and every rank takes rank 0's state, so a job that the
    launcher restarted on fewer or more ranks continues where it committed.

    Args:
        func: A function taking the state first.

    Returns:
        The wrapped function.

    Example:

    ```python
    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()
    train(hvd.elastic.TensorFlowKerasState(model, epoch=0))
    ```
    """
    @functools.wraps(func)
    def wrapper(state: ObjectState, *args: Any, **kwargs: Any) -> Any:
        resumed = broadcast_object(state._load_committed(), 0, name="HvdkerasElasticResumed")
        state.sync()
        if resumed:
            state.on_reset()
        return func(state, *args, **kwargs)

    return wrapper

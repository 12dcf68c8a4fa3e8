"""What every hvdkeras callback does when Keras hands it the model.

`fit()` calls `set_model` on its callbacks before it builds the train
function, which makes it the earliest point hvdkeras controls between
`compile()` and the first traced step.
"""

from __future__ import annotations

import weakref
from typing import Any

from hvdkeras import compat
from hvdkeras.engine import frameworks
from hvdkeras.training.optimizer import build_optimizer_early, check_model_optimizer_nesting
from hvdkeras.training.output import print_rank0

_noticed: "weakref.WeakSet[Any]" = weakref.WeakSet()


UNBUILT_REASON = ("the model is built by fit() itself, inside the first step, where XLA "
                  "cannot create variables (give it a keras.Input to keep XLA on)")


def turn_off_xla_for_training(model: Any, reason: str = "") -> bool:
    """Turns XLA off for the model's steps if compile() turned it on.

    `compile(jit_compile="auto")` resolves to True on GPU machines, where the
    hvdkeras collectives run under XLA only when asked for (`HVDKERAS_XLA_GPU`;
    on the CPU they always do: see Note [xla collectives] in
    ops/tf/xla_custom_calls.cc, and XLA stays on there).
    Clearing `train_function` makes
    `fit()` rebuild it without XLA. Prints a one-line notice (rank 0, once per
    model).

    Returns:
        Whether anything was changed.
    """
    if frameworks.keras_backend() != frameworks.TENSORFLOW:
        return False  # jit_compile means XLA only under TensorFlow
    try:
        enabled = bool(model.jit_compile)
    except AttributeError:
        return False
    from hvdkeras.collectives import xla_calls  # lazy: TensorFlow's, loaded under it alone

    why = reason or (xla_calls.refusal() if enabled else "")
    if not enabled or not why:
        return False
    model.jit_compile = False
    compat.reset_train_function(model)
    if model not in _noticed:
        _noticed.add(model)
        print_rank0(
            f"jit_compile turned off for {getattr(model, 'name', 'the model')!r}: "
            f"{why}, so the train step runs without XLA."
        )
    return True


def prepare_model(model: Any) -> None:
    """Turns XLA off for training, rejects a wrongly nested optimizer, and
    builds the optimizer where cross-step updates need it built."""
    if model is None:
        return
    turn_off_xla_for_training(model)
    check_model_optimizer_nesting(model)  # See Note [distributed wrapper outside loss scaling].
    build_optimizer_early(model)

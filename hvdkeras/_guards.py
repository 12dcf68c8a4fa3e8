"""Checks that turn silent hangs into clear errors at trace time.

Both run only while Python runs: when a train step is traced, or eagerly.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import tensorflow as tf

NESTING_MESSAGE = (
    "hvdkeras.DistributedOptimizer is wrapped inside a LossScaleOptimizer. The loss-scale "
    "optimizer checks this rank's own gradients for inf/NaN and skips the step on its own, "
    "so one rank could skip the gradient allreduce while the others wait in it. Put the "
    "distributed optimizer outside: set the 'mixed_float16' policy before calling "
    "hvdkeras.DistributedOptimizer (it then adds the LossScaleOptimizer inside itself and "
    "compile() leaves it alone), or write "
    "hvdkeras.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(optimizer))."
)

XLA_MESSAGE = (
    "hvdkeras collectives have no XLA kernel, but this train step is being compiled with "
    "XLA (compile(jit_compile=True), or the default jit_compile='auto' on a GPU machine). "
    "Pass an hvdkeras callback to fit() (e.g. hvdkeras.callbacks.BroadcastGlobalVariablesCallback, "
    "which turns XLA off for the train step), or call model.compile(..., jit_compile=False); "
    "in a custom loop, drop jit_compile=True from the tf.function that applies gradients."
)


def _loss_scale_optimizer_class():
    import keras

    return keras.optimizers.LossScaleOptimizer


def enclosing_loss_scale_optimizer(optimizer: Any) -> Optional[Any]:
    """The LossScaleOptimizer whose method is calling into `optimizer`, if any.

    Walks the Python call stack looking for a frame whose `self` is a
    LossScaleOptimizer with `optimizer` as its `inner_optimizer`: that is
    the wrong nesting (a loss-scale decision taken per rank, outside us).
    """
    lso_class = _loss_scale_optimizer_class()
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if isinstance(owner, lso_class) and getattr(owner, "inner_optimizer", None) is optimizer:
            return owner
        frame = frame.f_back
    return None


def check_not_inside_loss_scale_optimizer(optimizer: Any) -> None:
    """Raises ValueError when `optimizer` runs inside a LossScaleOptimizer."""
    if enclosing_loss_scale_optimizer(optimizer) is not None:
        raise ValueError(NESTING_MESSAGE)


def check_model_optimizer_nesting(model: Any) -> None:
    """The same check on a compiled model, before any step runs."""
    from hvdkeras.optimizer import is_distributed

    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", None)
    if (optimizer is not None and isinstance(optimizer, _loss_scale_optimizer_class())
            and not is_distributed(optimizer) and inner is not None and is_distributed(inner)):
        raise ValueError(NESTING_MESSAGE)


def in_xla_context() -> bool:
    """Whether the op being built now will be compiled by XLA."""
    if tf.executing_eagerly():
        return False
    try:
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - TensorFlow moved it; the engine error remains
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def check_not_in_xla() -> None:
    """Raises RuntimeError when called while building an XLA-compiled function."""
    if in_xla_context():
        raise RuntimeError(XLA_MESSAGE)

"""Making every rank hold the same model and optimizer state.

What may import this module: the rest of `hvdkeras.training`, the callbacks
and the top-level package.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from hvdkeras.backends import variables as any_backend
from hvdkeras.engine import frameworks
from hvdkeras.sharding.sharded_optimizer import everywhere_variables, is_sharded_parameter


def _model_label(model: Any) -> str:
    return f"{type(model).__name__} {getattr(model, 'name', '')!r}".strip()


def build_optimizer(model: Any, optimizer: Optional[Any] = None) -> Optional[Any]:
    """Creates the optimizer's variables (slots) now, if it has none yet.

    Keras builds the optimizer lazily, during the first train step; state
    that must be identical before step 1 needs it built earlier.

    Args:
        model: A built Keras model.
        optimizer: The optimizer; defaults to `model.optimizer`.

    Returns:
        The optimizer (None if the model has none).
    """
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    return optimizer


def _require_built(model: Any) -> None:
    if not getattr(model, "built", False):
        raise ValueError(
            f"{_model_label(model)} is not built, so it has no weights to synchronise yet. "
            "Build it before training: give it an input (keras.Input / input_shape), or call "
            "model.build(input_shape) or model(sample_batch) once. hvdkeras syncs every rank "
            "before the first step and cannot wait for Keras to build it inside step 1."
        )


def _unique(variables: List[Any]) -> List[Any]:
    seen, out = set(), []
    for v in variables:
        if id(v) not in seen:
            seen.add(id(v))
            out.append(v)
    return out


def broadcast_model(model: Any, root_rank: int = 0, optimizer: Optional[Any] = None,
                    exclude: Sequence[Any] = ()) -> None:
    """Copies the model's and its optimizer's state from `root_rank` to all ranks.

    Covers the model's weights (trainable and not, plus random-seed state)
    and every optimizer variable: iteration count, learning rate, slots, and
    a loss-scale optimizer's scale. A sharded optimizer (`zero_stage` 1 to
    3) keeps its slots where they are: each rank owns its own; weights
    sharded at stage 3 are one copy already, taken from rank 0. The optimizer is built first if needed,
    so its slots exist and are synchronised too. All values travel in one
    fused broadcast. Call it on every rank.

    Args:
        model: A built Keras model.
        root_rank: The rank whose state everyone receives.
        optimizer: The optimizer to include; defaults to `model.optimizer`
            (pass it for custom loops where the model is not compiled).
        exclude: Variables each rank keeps as they are (model-parallel
            layers that differ between ranks on purpose).

    Example:

    ```python
    model = make_model()                  # ranks may have different random init
    hvd.broadcast_model(model, optimizer=optimizer)
    ```
    """
    _require_built(model)
    optimizer = build_optimizer(model, optimizer)
    variables = list(model.variables)
    if optimizer is not None:
        variables += everywhere_variables(optimizer)
    kept = {id(v) for v in exclude}
    chosen = [v for v in _unique(variables) if id(v) not in kept and not is_sharded_parameter(v)]
    if frameworks.keras_backend() == frameworks.TENSORFLOW:
        from hvdkeras.collectives.broadcasting import broadcast_variables  # lazy: TF's own

        broadcast_variables(chosen, root_rank=root_rank, name="hvdkeras_broadcast_model")
    else:
        any_backend.broadcast_variables(chosen, root_rank=root_rank,
                                        name="hvdkeras_broadcast_model")

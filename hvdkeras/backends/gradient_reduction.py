"""How the torch and JAX optimizers reduce gradients: the engine's op and
scale factors, which gradients share a fused request, and the reduction
itself on the backend's own tensors.

What may import this module: the rest of `hvdkeras.backends`.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List, Sequence, Set, Tuple

import keras

from hvdkeras.backends import dispatch
from hvdkeras.engine import process_sets
from hvdkeras.engine.types import Average, Sum


def reduction_scaling(settings: Dict[str, Any], size: int, scale: float = 1.0
                      ) -> Tuple[int, float, float]:
    """The engine's (op, prescale, postscale) for the optimizer's reduction:
    `gradient_predivide_factor` f turns Average into a Sum of inputs times
    1/f, then f/size; the result is multiplied by `scale`."""
    factor = settings["gradient_predivide_factor"]
    if settings["op"] == Average and factor != 1.0:
        return Sum, 1.0 / factor, scale * factor / size
    return settings["op"], 1.0, scale


def reduce_gradients(grads: List[Any], variables: Sequence[Any],
                     settings: Dict[str, Any], local_ids: Set[int],
                     scale: float = 1.0) -> List[Any]:
    """The gradients averaged (or summed) over the process set, times `scale`;
    None stays None."""
    size = process_sets.view(settings["process_set"]).size
    local = {k for k, v in enumerate(variables) if id(v) in local_ids} if local_ids else set()
    present = [k for k, g in enumerate(grads) if g is not None and k not in local]
    out = list(grads)
    for k in local:
        if grads[k] is not None:
            if settings["scale_local_gradients"]:
                out[k] = out[k] / size
            if scale != 1.0:
                out[k] = out[k] * scale
    op, pre, post = reduction_scaling(settings, size, scale)
    for index, group in enumerate(gradient_groups(present, variables, settings)):
        reduced = _reduce_group([grads[k] for k in group], f"{settings['name']}.{index}", op,
                                pre, post, settings)
        for k, value in zip(group, reduced):
            out[k] = value
    return out


def _reduce_group(tensors: List[Any], name: str, op: int, prescale: float, postscale: float,
                  settings: Dict[str, Any]) -> List[Any]:
    """One fused reduction; under torch, eagerly and uncompressed, into the
    gradients themselves (as Horovod's and DDP's optimizers reduce `.grad`)."""
    if (keras.backend.backend() == "torch" and op in (Average, Sum)
            and getattr(settings["compression"], "name", "none") == "none"):
        # Lazy: the torch binding, present under that backend only.
        torch_ops = importlib.import_module("hvdkeras.backends.torch.ops")
        if torch_ops.reducible_in_place(tensors):
            torch_ops.allreduce_in_place(tensors, name, op, prescale, postscale,
                                         process_sets.view(settings["process_set"]).set_id)
            return tensors
    return dispatch.backend_function("grouped_allreduce")(
        tensors, name=name, op=op, prescale_factor=prescale, postscale_factor=postscale,
        compression=settings["compression"], process_set=settings["process_set"])


def gradient_groups(present: List[int], variables: Sequence[Any], settings: Dict[str, Any]
                    ) -> List[List[int]]:
    """Which gradients share a fused request: all, `num_groups` contiguous parts,
    or the explicit `groups` of variables plus one group of the rest."""
    if settings["groups"] is not None:
        position = {id(v): k for k, v in enumerate(variables)}
        chosen = [[position[id(v)] for v in group if position.get(id(v)) in present]
                  for group in settings["groups"]]
        listed = {k for group in chosen for k in group}
        rest = [k for k in present if k not in listed]
        return [g for g in chosen + [rest] if g]
    parts = settings["num_groups"]
    if parts and parts > 1 and present:
        step = -(-len(present) // parts)
        return [present[i:i + step] for i in range(0, len(present), step)]
    return [present] if present else []

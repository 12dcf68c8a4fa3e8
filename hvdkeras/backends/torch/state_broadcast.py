"""`broadcast_parameters` and `broadcast_optimizer_state`: a torch model's
and a `torch.optim` optimizer's state from one rank to all, under
`horovod.torch`'s names.

What may import this module: the facade (both names are public).
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple, Union

import torch

from hvdkeras.backends.torch import collectives
from hvdkeras.backends.torch import ops as torch_ops
from hvdkeras.engine import process_sets, world
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.host import objects


def _write_root_values(tensors: List[torch.Tensor], name: str, root_rank: int,
                       process_set: ProcessSet) -> None:
    """`root_rank`'s values into `tensors` themselves: contiguous CPU tensors
    in one request per dtype, the others (CUDA, strided) one by one."""
    set_id = process_sets.view(process_set).set_id
    direct = [t for t in tensors if t.device.type == "cpu" and t.is_contiguous()]
    if direct:  # flat views: the same memory, and no 0-d tensors (a step count)
        torch_ops.broadcast_in_place([t.view(-1) for t in direct], name, root_rank, set_id)
    others = [t for t in tensors if not (t.device.type == "cpu" and t.is_contiguous())]
    for k, tensor in enumerate(others):
        collectives.broadcast_(tensor, root_rank, name=f"{name}.other{k}",
                               process_set=process_set)


def broadcast_parameters(params: Union[Dict[str, Any], Iterable[Any]], root_rank: int = 0,
                         process_set: ProcessSet = global_process_set) -> None:
    """Copies `root_rank`'s tensors into every rank's, in place.

    Args:
        params: `model.state_dict()`, `model.named_parameters()`, or a list of
            tensors (or of (name, tensor) pairs), the same on every rank. A
            dict is taken in the order of its sorted keys, as in Horovod.
        root_rank: The rank whose values everyone receives.
        process_set: The ranks that take part (default: all).

    Example:

    ```python
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ```
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    tensors = []
    for name, value in items:
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"broadcast_parameters takes tensors; {name or 'an entry'} is a "
                             f"{type(value).__name__}. Pass model.state_dict() or "
                             "model.named_parameters().")
        tensors.append(value.data)
    _write_root_values(tensors, "broadcast_parameters", root_rank, process_set)


def _skeleton(value: Any, tensors: List[torch.Tensor]) -> Any:
    """`value` with each tensor replaced by a placeholder (its number, shape
    and dtype); the tensors are appended to `tensors`."""
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach().contiguous().cpu())
        return ("hvdkeras.tensor", len(tensors) - 1, tuple(value.shape),
                str(value.dtype).removeprefix("torch."))
    if isinstance(value, dict):
        return {k: _skeleton(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_skeleton(v, tensors) for v in value)
    return value


def _placeholders(value: Any, found: List[Tuple[int, Tuple[int, ...], str]]) -> None:
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "hvdkeras.tensor":
        found.append(value[1:])
    elif isinstance(value, dict):
        for v in value.values():
            _placeholders(v, found)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _placeholders(v, found)


def _filled(value: Any, tensors: List[torch.Tensor]) -> Any:
    if isinstance(value, tuple) and len(value) == 4 and value[0] == "hvdkeras.tensor":
        return tensors[value[1]]
    if isinstance(value, dict):
        return {k: _filled(v, tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_filled(v, tensors) for v in value)
    return value


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              process_set: ProcessSet = global_process_set) -> None:
    """Gives every rank `root_rank`'s optimizer state: each parameter's
    state tensors (momentum buffers, moments, step counts) and the groups'
    settings (learning rate, betas, ...).

    The structure and the settings travel as one pickled object; the
    tensors in one broadcast per dtype, straight into tensors of the right
    shape on the other ranks, which then load the state. A root that has
    not stepped yet sends an empty state, and every rank keeps none.

    Args:
        optimizer: A `torch.optim.Optimizer` (distributed or not) over the
            same parameters on every rank.
        root_rank: The rank whose state everyone receives.
        process_set: The ranks that take part (default: all).

    Example:

    ```python
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    ```
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state takes a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}; for Keras optimizers use "
                        "hvd.broadcast_model(model, optimizer=...) or the broadcast callback.")
    process_sets.view(process_set)  # a clear error for an unregistered set
    is_root = world.rank() == root_rank
    tensors: List[torch.Tensor] = []
    skeleton = _skeleton(optimizer.state_dict(), tensors) if is_root else None
    skeleton = objects.broadcast_object(skeleton, root_rank, name="broadcast_optimizer_state",
                                        process_set=process_set)
    if not is_root:
        found: List[Tuple[int, Tuple[int, ...], str]] = []
        _placeholders(skeleton, found)
        tensors = [torch.empty(shape, dtype=getattr(torch, dtype))
                   for _, shape, dtype in sorted(found)]
    _write_root_values(tensors, "broadcast_optimizer_state.tensors", root_rank, process_set)
    if not is_root:
        optimizer.load_state_dict(_filled(skeleton, tensors))

"""`DistributedOptimizer`: any Keras 3 optimizer, with gradients averaged
across ranks before it applies them, under every Keras backend.

This module is the public front, and it loads no framework itself: it checks
the arguments every backend shares and hands the optimizer to the running
backend's implementation (`hvdkeras.training.tf_optimizer` under TensorFlow,
`hvdkeras.backends.optimizer` under torch and JAX), which converts it in
place into a subclass of its own class.

What may import this module: the rest of `hvdkeras.training`,
`hvdkeras.callbacks`, `hvdkeras.spark`, the recipes' training code and the
top-level package.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Iterable, Optional, Sequence, Union

import keras

from hvdkeras.collectives.compression import Compression, Compressor
from hvdkeras.engine import config, frameworks, world
from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Average
from hvdkeras.sharding.checks import check_zero_stage
from hvdkeras.training import cross_step_rules, guards

# The module that makes optimizers distributed under each Keras backend.
_IMPLEMENTATIONS = {frameworks.TENSORFLOW: "hvdkeras.training.tf_optimizer",
                    frameworks.TORCH: "hvdkeras.backends.optimizer",
                    frameworks.JAX: "hvdkeras.backends.optimizer"}


def _implementation() -> Any:
    """The running backend's optimizer module (imported on first use: each loads
    its framework)."""
    backend = frameworks.keras_backend()
    frameworks.check_supported(backend)
    return importlib.import_module(_IMPLEMENTATIONS[backend])


def is_distributed(optimizer: Any) -> bool:
    """Whether `optimizer` was returned by `hvdkeras.DistributedOptimizer`."""
    torch_optim = _torch_optimizer_module(optimizer)
    if torch_optim is not None:
        return torch_optim.is_distributed(optimizer)
    return _implementation().is_distributed(optimizer)


def check_model_optimizer_nesting(model: Any) -> None:
    """Raises ValueError, before any step runs, when a compiled model's
    optimizer is a LossScaleOptimizer around a distributed optimizer."""
    optimizer = getattr(model, "optimizer", None)
    inner = getattr(optimizer, "inner_optimizer", None)
    if (optimizer is not None and isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            and not is_distributed(optimizer) and inner is not None and is_distributed(inner)):
        raise ValueError(guards.NESTING_MESSAGE)


def build_optimizer_early(model: Any) -> None:
    """Builds a compiled model's distributed optimizer now, outside any
    traced step, where cross-step updates ask for it (Note [cross-step
    updates] in `cross_step`): Keras would build it inside the first step,
    after that step's forward pass has read the weights."""
    if frameworks.keras_backend() != frameworks.TENSORFLOW:
        return
    optimizer = getattr(model, "optimizer", None)
    if (optimizer is None or getattr(optimizer, "built", True) or not is_distributed(optimizer)
            or not getattr(model, "built", False)):
        return
    w = world.require()
    if cross_step_rules.wanted(config.cross_step_overlap(), w.local_size, w.size):
        optimizer.build(model.trainable_variables)


def _torch_optimizer_module(optimizer: Any) -> Optional[Any]:
    """The module that distributes `torch.optim` optimizers, when `optimizer`
    is one (torch is imported already if it is); otherwise None."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(optimizer, torch.optim.Optimizer):
        return None
    return importlib.import_module("hvdkeras.backends.torch.torch_optim")


def _check_arguments(backward_passes_per_step: int, average_aggregated_gradients: bool) -> None:
    if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
        raise ValueError(
            f"backward_passes_per_step must be an integer >= 1, got {backward_passes_per_step!r}."
        )
    if not isinstance(average_aggregated_gradients, bool):
        raise TypeError(
            f"average_aggregated_gradients must be True or False, got {average_aggregated_gradients!r}."
        )


def _keras_optimizer(optimizer: Any, implementation: Any) -> keras.optimizers.Optimizer:
    """`optimizer` as a Keras 3 optimizer (a name is looked up) that
    `implementation` has not made distributed yet, or a clear error."""
    if isinstance(optimizer, str):
        optimizer = keras.optimizers.get(optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            "hvdkeras.DistributedOptimizer needs a Keras 3 optimizer (keras.optimizers.*), got "
            f"{type(optimizer).__module__}.{type(optimizer).__name__}. tf.keras (Keras 2) "
            "optimizers are not supported: import keras and use keras.optimizers."
        )
    if implementation.is_distributed(optimizer):
        raise ValueError(
            f"Optimizer {optimizer.name!r} is already distributed; wrap each optimizer once."
        )
    return optimizer


def DistributedOptimizer(optimizer: Union[keras.optimizers.Optimizer, str],
                         name: Optional[str] = None,
                         compression: Compressor = Compression.none,
                         sparse_as_dense: bool = False,
                         backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False,
                         gradient_predivide_factor: float = 1.0,
                         op: int = Average,
                         num_groups: int = 0,
                         groups: Optional[Sequence[Sequence[Any]]] = None,
                         device_dense: str = "",
                         device_sparse: str = "",
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True,
                         zero_stage: int = 0,
                         named_parameters: Optional[Any] = None) -> keras.optimizers.Optimizer:
    """Makes a Keras 3 optimizer average gradients across all ranks.

    Gradients are reduced at the top of `Optimizer.apply`, before the
    optimizer unscales, clips (`clipnorm`, `global_clipnorm`, `clipvalue`),
    applies weight decay, updates and tracks its EMA, so N ranks with batch B
    train like one process with batch N*B.

    The optimizer is converted in place (its state is kept) and returned;
    always use the returned object, which is a new one in one case: under
    the `"mixed_float16"` policy a plain optimizer is first wrapped in a
    `keras.optimizers.LossScaleOptimizer`, so that the loss-scale decision is
    taken on the averaged gradients, identically on every rank (`compile()`
    then keeps it as is). The reverse nesting, a LossScaleOptimizer around a
    distributed optimizer, raises an error when it is built or applied.

    A `torch.optim` optimizer is taken too, with `horovod.torch`'s semantics
    (gradients reduced by hooks during `backward()`, `synchronize()`,
    `skip_synchronize()`, `named_parameters`, `backward_passes_per_step`,
    `op`, `compression`, `num_groups`, `groups`, `sparse_as_dense`,
    `process_set`; see `docs/custom-loops.md`).

    Saving: a `.keras` file records the plain optimizer (e.g. `Adam`) and
    its state; load it with or without hvdkeras and wrap
    `model.optimizer` again to keep training on several ranks.

    Args:
        optimizer: A `keras.optimizers.Optimizer` (built-in, user subclass or
            LossScaleOptimizer), or a name such as `"adam"`.
        name: Prefix of the collective names; defaults to the optimizer's
            name. It must be the same on every rank.
        compression: `hvdkeras.Compression.none`, `.fp16` or `.bf16`: the
            dtype gradients travel in.
        sparse_as_dense: Densify `tf.IndexedSlices` gradients (`Embedding`)
            so they are fused with the dense ones; otherwise they are
            reduced in a collective of their own.
        backward_passes_per_step: Accumulate gradients locally over this many
            calls and reduce and apply once, on the last one. The calls in
            between change only the accumulators: `optimizer.iterations`
            counts updates, not passes.
        average_aggregated_gradients: With `backward_passes_per_step` > 1,
            divide the accumulated sum by the number of passes (one update
            then equals one update on the concatenated batches).
        gradient_predivide_factor: Average as a sum of gradients multiplied
            by 1/f before and f/size after the reduction (Average only).
        op: `hvdkeras.Average` (default) or `hvdkeras.Sum`.
        num_groups: Split the gradients into this many contiguous groups,
            one fused collective each. 0 (the default): one collective for
            all on one host; when the ranks span hosts or the rank sees a
            GPU, buckets of about 25 MB in the order the backward pass
            produces them, each reduced as soon as it is complete
            (`HVDKERAS_BACKWARD_OVERLAP`, `HVDKERAS_BUCKET_BYTES`).
        groups: Explicit groups as lists of variables (e.g. per layer); the
            variables not listed form one more group.
        device_dense: Accepted for Horovod scripts and not used: hvdkeras
            places its reductions itself (GPU tensors on the GPU, others on
            the CPU).
        device_sparse: Likewise accepted and not used.
        process_set: Reduce over this `ProcessSet`'s ranks only (default:
            all ranks); Average divides by its size.
        scale_local_gradients: Divide the gradients of variables registered
            with `optimizer.register_local_var(v)` (not reduced) by the
            process set's size (Horovod's default).
        zero_stage: Shard the optimizer's state across the ranks (see
            `docs/memory-scaling.md`). 0 (default): every rank keeps all of
            it. 1: each rank keeps the slots (moments, accumulators, EMA) of
            its own share of the variables, updates those and sends them to
            the others. 2: as 1, and gradients are reduce-scattered, so a
            rank receives the averaged gradients of its own variables only.
            3 (every backend): as 2, and the model's trainable weights are
            sharded too, gathered where a step reads them (reading one
            eagerly is then a collective: see the docs). Results equal
            stage 0's (bit for bit on one host); checkpoints written
            through hvdkeras are normal, unsharded files.
        named_parameters: For a `torch.optim` optimizer only:
            `model.named_parameters()`, which names each gradient's request
            (as in `horovod.torch`; also accepted as the second positional
            argument, where Horovod's torch API has it).

    Returns:
        The distributed optimizer.

    Example:

    ```python
    import hvdkeras as hvd
    hvd.init()
    opt = keras.optimizers.Adam(hvd.scale_lr(1e-3), global_clipnorm=1.0)
    opt = hvd.DistributedOptimizer(opt)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    ```
    """
    _check_arguments(backward_passes_per_step, average_aggregated_gradients)
    torch_optim = _torch_optimizer_module(optimizer)
    if torch_optim is not None:
        if name is not None and not isinstance(name, str):  # horovod.torch's positional order
            named_parameters, name = name, None
        if zero_stage or average_aggregated_gradients:
            raise ValueError("A torch.optim optimizer takes horovod.torch's arguments: "
                             "zero_stage and average_aggregated_gradients are for Keras "
                             "optimizers.")
        return torch_optim.DistributedOptimizer(
            optimizer, named_parameters=named_parameters, compression=compression,
            backward_passes_per_step=backward_passes_per_step, op=op,
            gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
            groups=groups, sparse_as_dense=sparse_as_dense, process_set=process_set, name=name)
    if named_parameters is not None:
        raise ValueError("named_parameters is for torch.optim optimizers; a Keras optimizer "
                         "names its requests after its variables.")
    implementation = _implementation()
    optimizer = _keras_optimizer(optimizer, implementation)
    check_zero_stage(zero_stage, op, process_set, optimizer, backward_passes_per_step)
    return implementation.DistributedOptimizer(
        optimizer, name=name, compression=compression, sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        gradient_predivide_factor=gradient_predivide_factor, op=op, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
        zero_stage=zero_stage)


def local_layer_variables(local_layers: Any) -> list:
    """The trainable variables of `local_layers` (one Keras layer or several)."""
    if local_layers is None:
        return []
    if isinstance(local_layers, keras.layers.Layer):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    bad = [type(layer).__name__ for layer in local_layers
           if not isinstance(layer, keras.layers.Layer)]
    if bad:
        raise ValueError(f"local_layers must be Keras layers; got {', '.join(bad)}.")
    return [v for layer in local_layers for v in layer.trainable_weights]


def PartialDistributedOptimizer(optimizer: Union[keras.optimizers.Optimizer, str],
                                name: Optional[str] = None,
                                local_layers: Optional[Iterable[Any]] = None,
                                scale_local_gradients: bool = True,
                                **kwargs: Any) -> keras.optimizers.Optimizer:
    """A `DistributedOptimizer` that leaves the gradients of `local_layers` unreduced.

    For layers each rank trains on its own (a per-rank head, a
    model-parallel shard): their gradients stay local, divided by the
    process set's size unless `scale_local_gradients=False`, as in Horovod.

    Args:
        optimizer: As in `DistributedOptimizer`.
        name: As in `DistributedOptimizer`.
        local_layers: A Keras layer or list of layers whose trainable
            variables stay local. Build them first (their variables must exist).
        scale_local_gradients: Divide local gradients by the set's size.
        **kwargs: Any other `DistributedOptimizer` argument.

    Returns:
        The distributed optimizer.

    Example:

    ```python
    opt = hvd.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                          local_layers=[model.get_layer("head")])
    ```
    """
    local_vars = local_layer_variables(local_layers)
    optimizer = DistributedOptimizer(optimizer, name=name,
                                     scale_local_gradients=scale_local_gradients, **kwargs)
    for var in local_vars:
        optimizer.register_local_var(var)
    return optimizer

"""`DistributedGradientTape`: a `tf.GradientTape` whose `gradient()` returns
gradients averaged across ranks, for custom training loops.

What may import this module: the top-level package.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Sequence, Set

import tensorflow as tf

from hvdkeras.engine.process_sets import ProcessSet, global_process_set
from hvdkeras.engine.types import Average
from hvdkeras.training import guards
from hvdkeras.collectives.compression import Compression, Compressor
from hvdkeras.training.gradient_reduction import ReductionSettings, reduce_gradients
from hvdkeras.training.optimizer import local_layer_variables


class _DistributedTapeMixin:
    _hvdkeras_reduction: ReductionSettings
    _hvdkeras_local_ids: Set[int]

    def register_local_source(self, source) -> None:
        """Keeps `source`'s gradient local (not reduced; see `scale_local_gradients`)."""
        self._hvdkeras_local_ids.add(id(source))

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        gradients = super().gradient(target, sources, output_gradients=output_gradients,
                                     unconnected_gradients=unconnected_gradients)
        guards.check_not_in_xla()
        flat_sources = tf.nest.flatten(sources)
        flat_gradients = tf.nest.flatten(gradients)
        reduced = reduce_gradients(flat_gradients, self._hvdkeras_reduction, flat_sources,
                                   self._hvdkeras_local_ids)
        return tf.nest.pack_sequence_as(gradients, reduced)


_TAPE_CLASSES: Dict[type, type] = {}


def _distributed_tape_class(base: type) -> type:
    derived = _TAPE_CLASSES.get(base)
    if derived is None:
        derived = type(f"Distributed{base.__name__}", (_DistributedTapeMixin, base), {})
        _TAPE_CLASSES[base] = derived
    return derived


def DistributedGradientTape(gradtape: tf.GradientTape,
                            compression: Compressor = Compression.none,
                            sparse_as_dense: bool = False,
                            op: int = Average,
                            gradient_predivide_factor: float = 1.0,
                            num_groups: int = 0,
                            groups: Optional[Sequence[Sequence[Any]]] = None,
                            name: str = "DistributedGradientTape",
                            device_dense: str = "",
                            device_sparse: str = "",
                            process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Makes `gradtape.gradient()` average the gradients across ranks.

    The tape is converted in place and returned, so it stays a
    `tf.GradientTape` (recording state included) and works both before and
    after the `with` block. All gradients of one `gradient()` call are
    reduced together; None gradients stay None.

    Args:
        gradtape: The `tf.GradientTape` to convert.
        compression: As in `hvdkeras.DistributedOptimizer`.
        sparse_as_dense: As in `hvdkeras.DistributedOptimizer`.
        op: As in `hvdkeras.DistributedOptimizer`.
        gradient_predivide_factor: As in `hvdkeras.DistributedOptimizer`.
        num_groups: As in `hvdkeras.DistributedOptimizer`.
        groups: As in `hvdkeras.DistributedOptimizer`.
        process_set: As in `hvdkeras.DistributedOptimizer`.
        scale_local_gradients: As in `hvdkeras.DistributedOptimizer` (local
            sources are registered with `tape.register_local_source(v)`).
        name: Prefix of the collective names (the same on every rank).
        device_dense: Accepted for Horovod scripts and not used: hvdkeras
            places its reductions itself.
        device_sparse: Likewise accepted and not used.

    Returns:
        The converted tape.

    Example:

    ```python
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)  # a plain Keras optimizer
    ```
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(
            f"hvdkeras.DistributedGradientTape needs a tf.GradientTape, got {type(gradtape).__name__}."
        )
    if isinstance(gradtape, _DistributedTapeMixin):
        raise ValueError("This tape is already distributed; wrap each tape once.")
    settings = ReductionSettings(
        op=op, compression=compression, sparse_as_dense=bool(sparse_as_dense),
        gradient_predivide_factor=float(gradient_predivide_factor), num_groups=num_groups,
        groups=None if groups is None else tuple(tuple(g) for g in groups), name=name,
        process_set=process_set, scale_local_gradients=bool(scale_local_gradients),
    )
    gradtape.__class__ = _distributed_tape_class(type(gradtape))
    gradtape._hvdkeras_reduction = settings
    gradtape._hvdkeras_local_ids = set()
    return gradtape


def PartialDistributedGradientTape(gradtape: tf.GradientTape,
                                   local_layers: Optional[Iterable[Any]] = None,
                                   scale_local_gradients: bool = True,
                                   **kwargs: Any) -> tf.GradientTape:
    """A `DistributedGradientTape` that leaves the gradients of `local_layers` unreduced.

    Args:
        gradtape: The `tf.GradientTape` to convert.
        local_layers: A Keras layer or list of layers whose variables' gradients stay local.
        scale_local_gradients: Divide local gradients by the process set's size.
        **kwargs: Any other `DistributedGradientTape` argument.

    Returns:
        The converted tape.

    Example:

    ```python
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[head])
    ```
    """
    local_vars = local_layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, scale_local_gradients=scale_local_gradients,
                                   **kwargs)
    for var in local_vars:
        tape.register_local_source(var)
    return tape

"""Every private TensorFlow, Keras and PyTorch API that hvdkeras relies on, in one place.

TensorFlow and Keras offer no public way to do the few things below, and
private APIs move between releases: the habit of reaching into them all over
its code is what broke Horovod on every Keras release. Here each use is one
small function that says why hvdkeras needs it, on which versions it was
checked, and what happens if a later release moves it: where hvdkeras can do
without, it degrades (and says so); where it cannot, it raises an error that
names the internal. Nothing else in the package imports from
`tensorflow.python` or `keras.src`, or touches private attributes of
TensorFlow or Keras objects (`tests/test_architecture.py` checks this).

Checked on TensorFlow 2.16.2, 2.17.1, 2.18.1, 2.19.1, 2.20.0 and 2.21.0 with
Keras 3.15.1: `scripts/test_tf_versions.sh` builds the op library and runs
the collectives and a `model.fit` equivalence test on each of them.

What may import this module: anything under `hvdkeras` (it imports only
TensorFlow, Keras and PyTorch themselves, lazily).
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Dict, Iterable, Optional, Tuple


def exempt_from_program_order(op_types: Iterable[str]) -> bool:
    """Keeps `tf.function` from chaining these stateful ops in program order,
    while still running them when their results are unused (see Note
    [stateful but unordered] in hvdkeras/engine/library.py).

    `tf.function` adds control dependencies between stateful ops in the order
    the Python code created them; collectives that ranks create in different
    orders would then deadlock, while the engine can negotiate any order.
    TensorFlow exempts its own collective ops through a module-level set in
    `tensorflow.python.framework.auto_control_deps` (TF 2.16-2.21); a second
    set there names order-free ops that must run all the same.

    Returns:
        Whether the exemption took effect. If not (a TensorFlow that moved
        the set), it warns: collectives in one function then run in program
        order, which is correct but can deadlock ranks whose graphs order
        them differently.
    """
    try:
        from tensorflow.python.framework import auto_control_deps  # lazy: TF internal, may be gone
    except ImportError:  # pragma: no cover - depends on the TF version
        auto_control_deps = None
    if auto_control_deps is None or not hasattr(auto_control_deps, "ASYNC_STATEFUL_OPS"):
        warnings.warn("hvdkeras could not exempt its collectives from tf.function's automatic "
                      "control dependencies in this TensorFlow version; collectives inside one "
                      "tf.function will run in program order.")
        return False
    auto_control_deps.ASYNC_STATEFUL_OPS = (
        frozenset(auto_control_deps.ASYNC_STATEFUL_OPS) | frozenset(op_types))
    # Out of the chain, they would also leave the function's control outputs,
    # so a collective whose result one rank ignores would be pruned on that
    # rank alone; TensorFlow's set of order-free ops that must still run
    # keeps them in.
    if not hasattr(auto_control_deps, "MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS"):
        warnings.warn("hvdkeras could not mark its collectives as must-run in this TensorFlow "
                      "version; a collective whose result is unused inside a tf.function may "
                      "be pruned.")
        return False
    auto_control_deps.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS = (
        frozenset(auto_control_deps.MUST_RUN_ORDER_INSENSITIVE_STATEFUL_OPS)
        | frozenset(op_types))
    return True


def in_xla_context() -> bool:
    """Whether the op being built now will be compiled by XLA.

    Uses `tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext`
    (TF 2.16-2.21). If it moves, this answers False and the collective's own
    "no XLA kernel" error from TensorFlow remains.
    """
    import tensorflow as tf  # lazy: only while tracing

    if tf.executing_eagerly():
        return False
    try:
        from tensorflow.python.ops import control_flow_util  # lazy: TF internal, may be gone
    except ImportError:  # pragma: no cover - depends on the TF version
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def disable_thread_spinning() -> bool:
    """Asks TensorFlow's thread pools, not yet created, to sleep when idle.

    TensorFlow reads `ConfigProto.experimental.disable_thread_spinning` when
    it creates its runtime but has no public setter in eager mode, so the
    option goes into the eager context's base config (its `_config`; TF
    2.16-2.21). The physical devices are listed first, while the base config
    is still the user's: TensorFlow imports device settings from it once, at
    that moment.

    Returns:
        Whether the option was set. If `_config` is gone, pools keep
        spinning: slower on shared cores, nothing worse.
    """
    import tensorflow as tf  # lazy: heavy, and only ranks that share cores need it
    from tensorflow.core.protobuf import config_pb2  # lazy: as above
    from tensorflow.python.eager import context  # lazy: TF internal, may be gone

    ctx = context.context()
    if not hasattr(ctx, "_config"):
        return False
    tf.config.list_physical_devices()
    config = config_pb2.ConfigProto()
    if ctx._config is not None:
        config.CopyFrom(ctx._config)
    config.experimental.disable_thread_spinning = True
    ctx._config = config
    return True


def tape_paused() -> Any:
    """A context in which no GradientTape records (TensorFlow's internal
    `record.stop_recording`, TF 2.16-2.21): ops that only order updates must
    not become part of a gradient."""
    from tensorflow.python.eager import record  # lazy: TF internal

    return record.stop_recording()


def keep_registered_name(base: type, derived: type) -> None:
    """Makes `derived` serialize under the name `base` was registered with.

    Keras records `get_registered_name(obj.__class__)` in saved files; for a
    class registered with `keras.saving.register_keras_serializable` that is
    "package>Name", found in `keras.src.saving.object_registration`'s
    `GLOBAL_CUSTOM_NAMES` (Keras 3.0-3.15). Mapping only this class-to-name
    direction leaves the name-to-class lookup (used when loading) pointing
    at `base`. If the table moves, a derived optimizer of a registered class
    saves under its own name and loads only with hvdkeras imported.
    """
    try:
        from keras.src.saving import object_registration  # lazy: Keras internal, may be gone
    except ImportError:  # pragma: no cover - a future Keras layout
        return
    names = object_registration.GLOBAL_CUSTOM_NAMES
    if base in names:
        names[derived] = names[base]


_WITH_MIXIN: Dict[Tuple[type, type], type] = {}


def with_mixin(mixin: type, base: type) -> type:
    """`base` with `mixin` in front, under `base`'s name, module and registered
    name, so a saved file records the plain class (made once per pair).

    Example: `optimizer.__class__ = with_mixin(MyMixin, type(optimizer))`.
    """
    derived = _WITH_MIXIN.get((mixin, base))
    if derived is None:
        derived = type(base.__name__, (mixin, base), {
            "__module__": base.__module__, "__qualname__": base.__qualname__,
            "__doc__": base.__doc__})
        keep_registered_name(base, derived)
        _WITH_MIXIN[(mixin, base)] = derived
    return derived


def class_without_mixins(obj: Any) -> type:
    """The class `obj` had before `with_mixin` put anything in front of it."""
    made = set(_WITH_MIXIN.values())
    return next(c for c in type(obj).__mro__
                if c not in made and not c.__module__.startswith("hvdkeras."))


def optimizer_variables_built_for(optimizer: Any) -> list:
    """The variables a Keras 3 optimizer was built for (`_trainable_variables`).

    Keras 3.0-3.15 keeps them in this attribute and offers no public
    accessor; `apply(grads)` without variables uses the same list.

    Raises:
        RuntimeError: naming the attribute, if a Keras release removed it.
    """
    try:
        return list(optimizer._trainable_variables)
    except AttributeError:  # pragma: no cover - a future Keras
        raise RuntimeError(
            "This Keras version has no Optimizer._trainable_variables, which hvdkeras reads to "
            "know the variables an optimizer was built for; please report it with your Keras "
            "version.") from None


def optimizer_learning_rate_holder(optimizer: Any) -> Optional[Any]:
    """What a Keras 3 optimizer stores its learning rate in (`_learning_rate`).

    A `keras.Variable` for a float rate, the `LearningRateSchedule` itself
    for a schedule (Keras 3.0-3.15). The public `learning_rate` property
    returns the *current value* of either, so it cannot tell them apart.
    None if a Keras release renamed the attribute (callers then treat the
    rate as not settable, with their own explanation).
    """
    return getattr(optimizer, "_learning_rate", None)


def set_variable_path(variable: Any, path: str) -> None:
    """Makes a `keras.Variable` answer to `path` (its `_path`, Keras 3.0-3.15).

    Keras fixes a variable's path from the name scope it was created in and
    offers no setter; a sharded optimizer's stand-ins need the path of the
    variable they stand for (optimizers such as Muon choose by path).
    """
    variable._path = path


def reset_train_function(model: Any) -> None:
    """Makes `fit()` build the model's train function again.

    `model.train_function` is the compiled step Keras caches (Keras 3.0-3.15);
    clearing it after changing `jit_compile` makes the next `fit()` trace a
    new one. `fit()` calls its callbacks' `set_model` before building it.
    """
    model.train_function = None


def layer_random_states(model: Any) -> list:
    """The state variables of every layer's random generator, in layer order.

    Dropout, GaussianNoise, the random augmentation layers and any layer
    holding a `keras.random.SeedGenerator` keep its state in a variable that
    `model.variables` lists but `model.save()` leaves out, so an exact resume
    must save it separately. Keras 3.0-3.15 keeps the generators in each
    layer's `_seed_generators` and the layers in `_flatten_layers()`; neither
    has a public accessor. If a Keras release moves them, this returns [] and
    warns once: a resumed run then draws new random numbers, as plain Keras does.
    """
    try:
        layers = model._flatten_layers(include_self=True, recursive=True)
        return [generator.state for layer in layers
                for generator in getattr(layer, "_seed_generators", [])]
    except AttributeError:  # pragma: no cover - a future Keras
        warnings.warn("This Keras version has no Layer._flatten_layers; hvdkeras checkpoints "
                      "leave out the layers' random-generator states, so a resumed run draws "
                      "different random numbers (e.g. Dropout masks).", stacklevel=2)
        return []


def xla_custom_call(operands: list, target: str, config: str, dtypes: list, shapes: list) -> list:
    """An XLA custom call of `target` (registered by the op library) on `operands`.

    TensorFlow's XlaCustomCallV2 op, from its private `gen_xla_ops` (TF
    2.16-2.21), lowers to exactly that call inside an XLA-compiled function:
    see Note [xla collectives] in ops/tf/xla_custom_calls.cc.
    """
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops  # lazy: TF internal, XLA only

    return list(gen_xla_ops.xla_custom_call_v2(
        operands=operands, call_target_name=target, backend_config=config,
        has_side_effect=True, result_dtypes=dtypes, result_shapes=shapes))


def torch_at_end_of_backward(callback: Any) -> None:
    """Has PyTorch's autograd engine call `callback()` once the backward pass
    now running ends, before `backward()` returns (what DDP waits for its
    reductions with).

    Uses `torch.autograd.Variable._execution_engine.queue_callback` (checked
    on torch 2.13; DDP has used it since PyTorch 1.x); call it from a hook
    that runs during the pass. If it moves, this raises an error that names it.
    """
    import torch  # lazy: only the torch backend reduces during the backward pass

    engine = getattr(torch.autograd.Variable, "_execution_engine", None)
    if not hasattr(engine, "queue_callback"):
        raise RuntimeError("hvdkeras needs torch.autograd.Variable._execution_engine."
                           "queue_callback, which this PyTorch version does not have; set "
                           "HVDKERAS_TORCH_BACKWARD_OVERLAP=0 to reduce in apply() instead.")
    engine.queue_callback(callback)


def variable_storage(variable: Any) -> Any:
    """The backend variable inside a Keras variable (under TensorFlow its
    `tf.Variable`). ZeRO stage 3 swaps it for the rows a rank holds (Note
    [sharded parameters]); Keras 3.15 keeps it in `_value`, with no public
    way to reach or replace it. Raises AttributeError if a release moves it."""
    return variable._value


def replace_variable_storage(variable: Any, storage: Any) -> None:
    """Makes `storage` the backend variable inside a Keras variable (see
    `variable_storage`)."""
    if not hasattr(variable, "_value"):
        raise AttributeError("this Keras release keeps a variable's value elsewhere than "
                             "_value; zero_stage=3 cannot shard the model's weights")
    variable._value = storage


def keras_jax_trainer_class() -> type:
    """Keras's JAX trainer class (`keras.src.backend.jax.trainer.JAXTrainer`,
    Keras 3.15), whose state handling ZeRO stage 3 wraps."""
    from keras.src.backend.jax import trainer  # lazy: Keras internal, JAX backend only

    return trainer.JAXTrainer


def in_stateless_scope() -> bool:
    """Whether a `keras.StatelessScope` is open (Keras's internal accessor, 3.15)."""
    from keras.src.backend.common import stateless_scope  # lazy: Keras internal

    return bool(stateless_scope.in_stateless_scope())


def stateless_value(variable: Any) -> Optional[Any]:
    """The value a `keras.StatelessScope` maps `variable` to, or None (no
    scope, or not mapped). Keras reads it in `Variable.value`; a class that
    overrides `value` (Note [sharded parameters]) must honour it the same
    way, through Keras's internal scope accessors (3.15)."""
    from keras.src.backend.common import stateless_scope  # lazy: Keras internal

    if not stateless_scope.in_stateless_scope():
        return None
    return stateless_scope.get_stateless_scope().get_current_value(variable)


def no_autocast() -> Any:
    """A context in which Keras variables read as their own dtype, whatever
    mixed policy the caller's layer is under (Keras 3's `AutocastScope`)."""
    from keras.src.backend import AutocastScope  # lazy: Keras internal, 3.0-3.15

    return AutocastScope(None)


def autocast_value(variable: Any, value: Any) -> Any:
    """`value` cast as Keras casts `variable`'s reads under a mixed policy."""
    return variable._maybe_autocast(value)


def torch_symbolic_device() -> bool:
    """Whether Keras's torch backend is inferring shapes (its device is then
    torch's "meta" device, where Keras's variables read as empty stand-ins;
    `keras.src.backend.torch.core.get_device`, Keras 3.15)."""
    from keras.src.backend.torch.core import get_device  # lazy: Keras internal, torch only

    return str(get_device()) == "meta"


_TORCH_TRACKING = ("_track_variables", "_post_track_variable")


def keras_torch_tracking_read() -> bool:
    """Whether the variable read now running is Keras's torch layer
    registering its variables as module parameters (`TorchLayer.
    _track_variables` and `_post_track_variable` in
    keras/src/backend/torch/layer.py, Keras 3.15, which store
    `variable.value`). A model's own parameters are registered lazily, at
    its first `parameters()` call, which may come after ZeRO stage 3 has
    sharded the weights: such a read must get the parameter holding the
    rows (Note [sharded parameters under torch]), not a whole gathered copy
    that torch would keep as a new parameter."""
    frame = sys._getframe(2)  # the caller of the variable's `value`
    for _ in range(3):  # the comprehension, the method, no further
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name in _TORCH_TRACKING and code.co_filename.endswith(
                os.path.join("torch", "layer.py")):
            return True
        frame = frame.f_back
    return False


_KERAS_SAVES = ("save_model", "save_weights_only", "_save_state")
_KERAS_SAVING_FILE = os.path.join("keras", "src", "saving", "saving_lib.py")


def inside_keras_save() -> bool:
    """Whether Keras's saving (`model.save`, `save_weights`, a
    `ModelCheckpoint`: `save_model`, `save_weights_only` and `_save_state` in
    keras/src/saving/saving_lib.py, Keras 3.15) is on the stack. A sharded
    weight read there outside `gathered_optimizer_state` is refused at once:
    a save on rank 0 alone would otherwise wait on a gather that no other
    rank makes."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name in _KERAS_SAVES and code.co_filename.endswith(_KERAS_SAVING_FILE):
            return True
        frame = frame.f_back
    return False


def dataset_op_types(dataset: Any) -> Optional[set]:
    """The op types of the graph that makes a `tf.data` dataset (e.g.
    "ShuffleDatasetV3"), or None where TensorFlow cannot say.

    Uses `tf.data.Dataset._as_serialized_graph()` (checked on TensorFlow
    2.16.2 to 2.21.0); tf.data has no public way to list a pipeline's
    transformations. Used to refuse a pipeline that shuffles before it is
    sharded; if the method moves, the check is skipped (None).
    """
    import tensorflow as tf  # lazy: only tf.data pipelines are inspected

    serialize = getattr(dataset, "_as_serialized_graph", None)
    if serialize is None:
        return None
    try:
        graph = tf.compat.v1.GraphDef.FromString(serialize().numpy())
    except Exception:  # a dataset TensorFlow cannot serialise (a Python generator's state)
        return None
    return ({node.op for node in graph.node}
            | {node.op for function in graph.library.function for node in function.node_def})

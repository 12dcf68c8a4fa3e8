"""Cross-step updates under TensorFlow: a step's gradient reductions still
on the wire when it returns, each variable updated just before the next
step's first read of it.

Note [cross-step updates]
~~~~~~~~~~~~~~~~~~~~~~~~~
With `HVDKERAS_CROSS_STEP_OVERLAP` on, and an optimizer that updates each
variable on its own (`cross_step_rules.refusal`), `DistributedOptimizer`'s
`apply` neither waits for its reductions nor updates anything: it starts one
pending reduction per gradient bucket (Note [pending reductions] in
ops/tf/pending_reductions.cc; the buckets of Note [gradient buckets], planned
from the variables, which are the gradients' shapes and dtypes), keeps the
step's learning rate and iteration count, advances the iteration count, and
marks each bucket pending. Each trained variable gets a class whose `value`
(every read: the forward pass, `handle`, `numpy`, saving) first finishes its
bucket: inside a traced function, the first read of a bucket's variable in
that graph places a `tf.cond` on the bucket's pending flag whose branch
waits for the reduction and updates the bucket's variables exactly as
Keras's `apply` would (unscale, clip, decay, update, constraints) with the
kept learning rate and iteration count; tf.function's automatic control
dependencies then run that branch before the read (both touch the
variable), and the reads of later layers do not wait for it. An eager read
or assignment finishes every bucket first, and so does an eager read of an
optimizer slot. The update of a variable is therefore the synchronous
step's, bit for bit, and happens before its next use, wherever that is:
the next step, `evaluate`, `predict`, a callback, a checkpoint.

Invariants:
- A step's `apply` finishes every bucket still pending before it starts
  new ones (its gates come first, and each start depends on its bucket's
  gate), so a bucket is never pending twice and its collective name is
  free again when it restarts.
- After a start, the graph forgets its gates: a read later in the same graph
  waits for the new reduction instead of reading the old weights.
- The gradients must be the planned ones (every trained variable, dense, no
  local variables): otherwise that trace keeps the synchronous step, after
  finishing what is pending.
- An XLA-compiled function can hold no gate: once one has read the
  weights, no step starts pending reductions (the ones before it raise).
- A function traced before the optimizer was built has no gates: a
  `predict` traced before the first `fit` must be traced again (Keras does
  when `compile` is called again) to see pending updates.

What may import this module: `hvdkeras.training.tf_optimizer`.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import keras
import tensorflow as tf

from hvdkeras import compat
from hvdkeras.collectives import kernels
from hvdkeras.engine import buckets, process_sets, world
from hvdkeras.training.gradient_reduction import ReductionSettings, scale_factors


class _Bucket(NamedTuple):
    positions: tuple
    # On the wire before the buckets of later variables (Note [priority on
    # the wire] in ops/core/wire_order.h): the next forward pass reads the
    # first variables first.
    priority: int
    wire_dtype: tf.DType
    context: Any  # the compression's context, the same for every member
    name: str
    pending: tf.Variable
    handle: tf.Variable


class PendingUpdates:
    """The buckets of one optimizer whose updates wait for the next reads.

    Args:
        optimizer: The distributed optimizer (built).
        variables: The variables it was built for, in its order.
        settings: How gradients are reduced (a `ReductionSettings`).
    """

    def __init__(self, optimizer: Any, variables: Sequence[Any],
                 settings: ReductionSettings) -> None:
        self.optimizer = optimizer
        self.variables = list(variables)
        self.settings = settings
        self._local = threading.local()
        self._gates: "weakref.WeakKeyDictionary[Any, Dict[int, tf.Tensor]]" = (
            weakref.WeakKeyDictionary())
        self._flush_function: Optional[Any] = None
        self.started = False
        self.read_by_xla = False
        sizes = [v.shape.num_elements() * tf.as_dtype(v.dtype).size for v in self.variables]
        dtypes = [tf.as_dtype(v.dtype).name for v in self.variables]
        limit = buckets.bucket_limit(default=buckets.PIECE_BYTES)
        planned = buckets.buckets(sizes, dtypes, limit, min(limit, buckets.FIRST_BUCKET_BYTES))
        self.buckets: List[_Bucket] = []
        self.bucket_of: Dict[int, int] = {}
        with tf.init_scope():
            for number, members in enumerate(planned):
                probe = tf.zeros([0], self.variables[members[0]].dtype)
                wire, context = settings.compression.compress(probe)
                self.buckets.append(_Bucket(
                    tuple(sorted(members)), min(members) + 1, wire.dtype, context,
                    f"{settings.name}_pending_{number}",
                    tf.Variable(False, trainable=False, name="hvdkeras_pending"),
                    tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdkeras_handle")))
                for p in members:
                    self.bucket_of[id(self.variables[p])] = number
            self.learning_rate = tf.Variable(0.0, dtype=tf.float32, trainable=False,
                                             name="hvdkeras_step_learning_rate")
            self.iteration = tf.Variable(0, dtype=tf.int64, trainable=False,
                                         name="hvdkeras_step_iteration")
            self.outstanding = tf.Variable(0, dtype=tf.int32, trainable=False,
                                           name="hvdkeras_pending_buckets")

    # -- state ------------------------------------------------------------

    @property
    def applying(self) -> bool:
        """Whether a bucket's update is being built on this thread (its
        reads of variables and slots must not wait for themselves)."""
        return getattr(self._local, "depth", 0) > 0

    def _enter(self) -> None:
        self._local.depth = getattr(self._local, "depth", 0) + 1

    def _leave(self) -> None:
        self._local.depth -= 1

    # -- before reads -----------------------------------------------------

    def before_read(self, variable: Any) -> None:
        """Called before every read or assignment of a trained variable."""
        if self._gates_wanted():
            self._gate(self.bucket_of[id(variable)])

    def before_any_read(self) -> None:
        """Called before a read of an optimizer slot: every bucket first."""
        if self._gates_wanted():
            self._gate_all()

    def _gates_wanted(self) -> bool:
        """Whether this read needs gates in the current graph: not inside an
        update, not eagerly (everything is finished now instead), not under
        XLA (`_xla_read`)."""
        if self.applying:
            return False
        if tf.executing_eagerly():
            self.flush()
            return False
        return not self._xla_read()

    def _xla_read(self) -> bool:
        """Whether this read is inside an XLA-compiled function, which can
        hold no gate: it is allowed while nothing was ever pending, and from
        then on no step starts pending reductions (that function would read
        the weights without waiting for them)."""
        if not compat.in_xla_context():
            return False
        self.read_by_xla = True
        if self.started:
            raise RuntimeError(
                "hvdkeras: an XLA-compiled function reads weights whose updates may still be "
                "pending (HVDKERAS_CROSS_STEP_OVERLAP is on), and XLA cannot wait for them. "
                "Compile it without XLA (jit_compile=False), or set "
                "HVDKERAS_CROSS_STEP_OVERLAP=0.")
        return True

    def flush(self) -> None:
        """Finishes every pending bucket now (eagerly)."""
        if not self.started or int(self.outstanding.numpy()) == 0:
            return
        if self._flush_function is None:
            self._flush_function = tf.function(self._gate_all, autograph=False)
        self._flush_function()

    def _gate_all(self) -> List[tf.Tensor]:
        return [self._gate(number) for number in range(len(self.buckets))]

    def _gate(self, number: int) -> tf.Tensor:
        """The bucket's gate in the current graph (made at its first use)."""
        graph = tf.compat.v1.get_default_graph()
        gates = self._gates.setdefault(graph, {})
        if number not in gates:
            bucket = self.buckets[number]
            with compat.tape_paused(), tf.name_scope(f"{bucket.name}_gate"):
                gates[number] = tf.cond(bucket.pending, lambda: self._finish(number),
                                        lambda: tf.constant(False))
        return gates[number]

    # -- finishing a bucket -----------------------------------------------

    def _finish(self, number: int) -> tf.Tensor:
        bucket = self.buckets[number]
        variables = [self.variables[p] for p in bucket.positions]
        reduced = kernels.allreduce_done(bucket.handle.read_value(), bucket.wire_dtype,
                                         [tf.TensorShape(v.shape) for v in variables],
                                         name=f"{bucket.name}_done")
        grads = [self.settings.compression.decompress(r, bucket.context) for r in reduced]
        self._enter()
        try:
            # The gate may sit inside a layer's call under a mixed policy:
            # the update reads the variables as they are stored.
            with compat.no_autocast():
                bucket.pending.assign(False)
                self.outstanding.assign_sub(1)
                apply_like_keras(self.optimizer, grads, variables)
        finally:
            self._leave()
        return tf.constant(True)

    # -- starting a step --------------------------------------------------

    def start(self, grads: Sequence[Any], variables: Optional[Sequence[Any]]) -> bool:
        """Starts the step's reductions (the gradients of `variables`, or of
        every trained variable when None). Returns False, having finished
        what was pending, when the gradients are not the planned ones: the
        caller then takes the synchronous step."""
        if self._xla_read():
            return False
        gates = self._gate_all()
        if not self._planned(grads, variables):
            return False
        optimizer = self.optimizer
        with tf.control_dependencies(gates):
            current = tf.cast(optimizer._get_current_learning_rate(), tf.float32)
            iteration = tf.cast(tf.convert_to_tensor(optimizer._iterations), tf.int64)
        self.learning_rate.assign(current)
        self.iteration.assign(iteration)
        wire_op, prescale, postscale = scale_factors(
            self.settings.op, self.settings.gradient_predivide_factor,
            process_sets.view(self.settings.process_set).size)
        set_id = process_sets.view(self.settings.process_set).set_id
        for number, bucket in enumerate(self.buckets):
            wire = [self.settings.compression.compress(grads[p])[0] for p in bucket.positions]
            with tf.control_dependencies([gates[number]]):
                handle = kernels.allreduce_start(wire, wire_op, prescale, postscale, bucket.name,
                                                 set_id, priority=bucket.priority)
            bucket.handle.assign(handle)
            bucket.pending.assign(True)
        self.outstanding.assign(len(self.buckets))
        optimizer._iterations.assign_add(1)
        self.started = True
        self._gates[tf.compat.v1.get_default_graph()] = {}
        return True

    def _planned(self, grads: Sequence[Any], variables: Optional[Sequence[Any]]) -> bool:
        if tf.executing_eagerly() or compat.in_xla_context() or self.read_by_xla:
            return False
        if variables is not None and [id(v) for v in variables] != [id(v) for v in
                                                                   self.variables]:
            return False
        if len(grads) != len(self.variables) or self.optimizer._hvdkeras_local_ids:
            return False
        return all(g is not None and not isinstance(g, tf.IndexedSlices) for g in grads)


def apply_like_keras(optimizer: Any, grads: List[Any], variables: List[Any]) -> None:
    """What Keras's `Optimizer.apply` does to `variables` (all with dense
    gradients, none overwritten by its gradient, no EMA, no accumulation),
    less advancing the iteration count: unscale, clip, decay, update, and
    the variables' constraints."""
    scale = optimizer.loss_scale_factor
    if scale is not None:
        grads = [g / scale for g in grads]
    grads = optimizer._clip_gradients(grads)
    optimizer._apply_weight_decay(variables)
    optimizer._backend_update_step(grads, variables, optimizer.learning_rate)
    for variable in variables:
        if variable.constraint is not None:
            variable.assign(variable.constraint(variable))


class CrossStepOptimizerMixin:
    """Placed in front of a distributed optimizer with cross-step updates:
    while a bucket's update is built, the learning rate and the iteration
    count are those its step kept."""

    _hvdkeras_cross_step: PendingUpdates

    def _get_current_learning_rate(self):
        pending = self._hvdkeras_cross_step
        if pending.applying:
            return pending.learning_rate.read_value()
        return super()._get_current_learning_rate()

    @property
    def iterations(self):
        pending = self._hvdkeras_cross_step
        if pending.applying:
            return pending.iteration.read_value()
        return super().iterations

    def finalize_variable_values(self, var_list):
        # The end of `fit`: no rank leaves it with updates still pending, so
        # a rank that exits right after cannot shut the engine down under
        # another rank's last step.
        self._hvdkeras_cross_step.flush()
        return super().finalize_variable_values(var_list)


class CrossStepVariableMixin:
    """Placed in front of a trained variable's class: its bucket is finished
    before any read or assignment (Note [cross-step updates])."""

    _hvdkeras_cross_step: PendingUpdates

    @property
    def value(self):
        self._hvdkeras_cross_step.before_read(self)
        return super().value

    def _direct_assign(self, value):
        self._hvdkeras_cross_step.before_read(self)
        return super()._direct_assign(value)


class CrossStepSlotMixin:
    """Placed in front of an optimizer slot's class: every bucket is
    finished before it is read or assigned outside an update."""

    _hvdkeras_cross_step: PendingUpdates

    @property
    def value(self):
        self._hvdkeras_cross_step.before_any_read()
        return super().value

    def _direct_assign(self, value):
        self._hvdkeras_cross_step.before_any_read()
        return super()._direct_assign(value)


def enable(optimizer: Any, variables: Sequence[Any], settings: ReductionSettings) -> PendingUpdates:
    """Gives `optimizer` (built on `variables`) cross-step updates."""
    pending = PendingUpdates(optimizer, variables, settings)
    for variable in pending.variables:
        variable.__class__ = compat.with_mixin(CrossStepVariableMixin, type(variable))
        variable._hvdkeras_cross_step = pending
    shared = {id(optimizer._iterations), id(getattr(optimizer, "_learning_rate", None))}
    for variable in optimizer.variables:
        if id(variable) in shared or not isinstance(variable, keras.Variable):
            continue
        variable.__class__ = compat.with_mixin(CrossStepSlotMixin, type(variable))
        variable._hvdkeras_cross_step = pending
    optimizer.__class__ = compat.with_mixin(CrossStepOptimizerMixin, type(optimizer))
    optimizer._hvdkeras_cross_step = pending
    _flush_at_exit(pending)
    return pending


def _flush_at_exit(pending: PendingUpdates) -> None:
    """Finishes what a custom loop left pending before the interpreter's
    exit shuts the engine down (atexit runs this before the shutdown that
    `hvdkeras.init` registered earlier): the other ranks may still be
    starting the same step's reductions, and a shutdown would fail them."""
    ref = weakref.ref(pending)

    def flush() -> None:
        alive = ref()
        if alive is not None and world.is_initialized():
            alive.flush()

    atexit.register(flush)

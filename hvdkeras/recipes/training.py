"""Running a validated recipe on this rank: optimizer, callbacks, fit, summary.

Call `run(recipe)` on every rank after `hvdkeras.init()` (the
`hvdkeras.recipes.run` module does both); rank 0 prints the summary.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from hvdkeras.recipes import schema
from hvdkeras.recipes.data import Data, build_data
from hvdkeras.recipes.models import build_model

# --------------------------------------------------------------------------
# Name lookups (also used by resolve.py for the checks before launch)
# --------------------------------------------------------------------------

_NOT_USER_OPTIMIZERS = {"Optimizer", "LossScaleOptimizer", "MultiOptimizer"}


def _squash(name: str) -> str:
    return name.replace("_", "").lower()


def optimizer_classes() -> Dict[str, type]:
    """keras.optimizers classes by lower-case name ('adam': Adam, ...)."""
    import keras

    found = {}
    for name in dir(keras.optimizers):
        item = getattr(keras.optimizers, name)
        if isinstance(item, type) and issubclass(item, keras.optimizers.Optimizer) \
                and name not in _NOT_USER_OPTIMIZERS:
            found[name.lower()] = item
    return found


def _module_classes(module, base) -> Dict[str, type]:
    return {_squash(n): getattr(module, n) for n in dir(module)
            if isinstance(getattr(module, n), type) and issubclass(getattr(module, n), base)}


def loss_names() -> List[str]:
    import keras

    return sorted(n for n in dir(keras.losses) if not n.startswith("_")
                  and n not in ("get", "serialize", "deserialize", "Loss", "Reduction"))


def metric_names() -> List[str]:
    import keras

    names = [n for n in dir(keras.metrics) if not n.startswith("_")
             and n not in ("get", "serialize", "deserialize", "Metric", "MeanMetricWrapper")]
    return sorted(names + ["accuracy", "acc", "crossentropy", "ce"])


def _with_args(module: Any, base: type, where: str, spec: dict):
    """An instance of the class in `module` named spec['name'], built with spec['args']."""
    cls = _module_classes(module, base).get(_squash(spec["name"]))
    if cls is None:
        raise ValueError(f"no {where} class named {spec['name']!r} takes arguments")
    return cls(**spec["args"])


def make_loss(spec: Any):
    """A loss for compile(): a name, or {name, args} (class found by name)."""
    import keras

    if isinstance(spec, str):
        return keras.losses.get(spec)
    return _with_args(keras.losses, keras.losses.Loss, "keras.losses", spec)


def make_metric(spec: Any):
    """A metric for compile(): 'accuracy' and friends pass through as strings."""
    import keras

    if isinstance(spec, str):
        if spec in ("accuracy", "acc", "crossentropy", "ce"):
            return spec
        return keras.metrics.get(spec)
    return _with_args(keras.metrics, keras.metrics.Metric, "keras.metrics", spec)


# --------------------------------------------------------------------------
# Learning rate and optimizer
# --------------------------------------------------------------------------


def make_learning_rate(recipe: dict, size: int, steps_per_epoch: int,
                       total_batches: int) -> Tuple[Any, Dict[str, Any]]:
    """(float or LearningRateSchedule, the plan from `schema.schedule_plan`)."""
    import keras

    from hvdkeras.schedules import WarmupSchedule

    plan = schema.schedule_plan(recipe, size, steps_per_epoch, total_batches)
    base, schedule = plan["base"], plan["schedule"]
    schedules = keras.optimizers.schedules
    after = None
    if schedule is not None and schedule["name"] != "constant":
        name, decay = schedule["name"], plan["decay_steps"]
        if name == "cosine":
            after = schedules.CosineDecay(base, decay, alpha=schedule["alpha"])
        elif name == "exponential":
            after = schedules.ExponentialDecay(base, decay, schedule["decay_rate"],
                                               staircase=schedule["staircase"])
        elif name == "inverse_time":
            after = schedules.InverseTimeDecay(base, decay, schedule["decay_rate"],
                                               staircase=schedule["staircase"])
        elif name == "polynomial":
            after = schedules.PolynomialDecay(base, decay,
                                              end_learning_rate=base * schedule["end_multiplier"],
                                              power=schedule["power"])
        elif name == "piecewise":
            after = schedules.PiecewiseConstantDecay(
                plan["boundaries"], [base * m for m in schedule["multipliers"]])
    if plan["warmup_steps"]:
        return WarmupSchedule(base, plan["warmup_steps"], after=after, size=size), plan
    if after is not None:
        return after, plan
    return base, plan


def make_optimizer(recipe: dict, learning_rate: Any):
    """The recipe's Keras optimizer wrapped in hvdkeras.DistributedOptimizer."""
    import hvdkeras

    opt = recipe["optimizer"]
    cls = optimizer_classes()[opt["name"].lower()]
    optimizer = cls(learning_rate=learning_rate, **opt["args"])
    compression = getattr(hvdkeras.Compression, opt["compression"])
    return hvdkeras.DistributedOptimizer(
        optimizer, compression=compression,
        backward_passes_per_step=opt["backward_passes_per_step"])


# --------------------------------------------------------------------------
# Callbacks
# --------------------------------------------------------------------------


def _callback_classes():
    import keras

    class LearningRateLogger(keras.callbacks.Callback):
        """Writes the current learning rate into the epoch logs."""

        def on_epoch_end(self, epoch, logs=None):
            from hvdkeras import lr_access

            if logs is not None:
                logs["learning_rate"] = lr_access.get_learning_rate(self.model.optimizer)

    class StopAtStep(keras.callbacks.Callback):
        """Stops after `total` batches in all (training.steps); same step on every rank."""

        def __init__(self, total: int, steps_per_epoch: int):
            super().__init__()
            self.total, self.steps_per_epoch = total, steps_per_epoch
            self._epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if self._epoch * self.steps_per_epoch + batch + 1 >= self.total:
                self.model.stop_training = True

    class Throughput(keras.callbacks.Callback):
        """Examples per second over all ranks, leaving out each epoch's first
        batch (tracing, and the validation pass before it)."""

        def __init__(self, global_batch: int):
            super().__init__()
            self.global_batch = global_batch
            self.seconds = 0.0
            self.batches = 0
            self._last: Optional[float] = None
            self._last_batch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self._last = None

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            if self._last is not None:
                self.seconds += now - self._last
                self.batches += batch - self._last_batch
            self._last, self._last_batch = now, batch

        @property
        def examples_per_second(self) -> Optional[float]:
            if self.seconds <= 0 or self.batches <= 0:
                return None
            return self.batches * self.global_batch / self.seconds

    return LearningRateLogger, StopAtStep, Throughput


def tensorboard_callback(section: dict):
    import keras

    try:
        return keras.callbacks.TensorBoard(
            log_dir=section["log_dir"], update_freq=section["update_freq"],
            histogram_freq=section["histogram_freq"], write_graph=section["write_graph"],
            profile_batch=section["profile_batch"])
    except ImportError as error:  # pragma: no cover - resolve.py checks this first
        raise RuntimeError("callbacks.tensorboard needs the 'tensorboard' package, which "
                           "TensorFlow 2.21 no longer installs: pip install tensorboard") from error


def make_callbacks(recipe: dict, rank: int, steps_per_epoch: int, total_batches: Optional[int],
                   global_batch: int) -> Tuple[list, Any]:
    """The callback list, in the order hvdkeras needs, and the throughput meter."""
    import keras

    import hvdkeras

    LearningRateLogger, StopAtStep, Throughput = _callback_classes()
    throughput = Throughput(global_batch)
    callbacks: list = [
        hvdkeras.callbacks.BroadcastGlobalVariablesCallback(0),
        hvdkeras.callbacks.MetricAverageCallback(),
        LearningRateLogger(),
        throughput,
    ]
    if total_batches is not None:
        callbacks.append(StopAtStep(total_batches, steps_per_epoch))
    sections = recipe["callbacks"]
    early = sections["early_stopping"]
    if early is not None:
        callbacks.append(keras.callbacks.EarlyStopping(
            monitor=early["monitor"], patience=early["patience"], min_delta=early["min_delta"],
            mode=early["mode"], restore_best_weights=early["restore_best_weights"],
            start_from_epoch=early["start_from_epoch"], verbose=1 if rank == 0 else 0))
    if rank == 0:
        if sections["csv_logger"] is not None:
            section = sections["csv_logger"]
            os.makedirs(os.path.dirname(section["path"]) or ".", exist_ok=True)
            callbacks.append(keras.callbacks.CSVLogger(section["path"], separator=section["separator"],
                                                       append=section["append"]))
        if sections["tensorboard"] is not None:
            callbacks.append(tensorboard_callback(sections["tensorboard"]))
    checkpoint = recipe["checkpoint"]
    if checkpoint is not None:
        callbacks.append(hvdkeras.callbacks.CheckpointCallback(
            checkpoint["dir"], keep_last=checkpoint["keep"], save_best_only=checkpoint["best_only"],
            monitor=checkpoint["monitor"], mode=checkpoint["mode"], verbose=0))
    return callbacks, throughput


# --------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------


def agree_steps(local: int, name: str) -> int:
    """The smallest `local` over all ranks (every rank must run as many steps)."""
    import tensorflow as tf

    import hvdkeras

    if hvdkeras.size() == 1:
        return local
    value = hvdkeras.allreduce(tf.constant(local, tf.int64), op=hvdkeras.Min, name=name)
    return int(value.numpy())


def _averaged_evaluation(model, data: Data, steps: Optional[int]) -> Dict[str, float]:
    """Validation metrics averaged over ranks (used when no epoch ran)."""
    import tensorflow as tf

    import hvdkeras

    results = model.evaluate(data.validation, steps=steps, verbose=0, return_dict=True)
    keys = sorted(results)
    values = tf.constant([float(results[k]) for k in keys], tf.float64)
    if hvdkeras.size() > 1:
        values = hvdkeras.allreduce(values, op=hvdkeras.Average, name="recipe_final_evaluation")
    return {f"val_{k}": float(v) for k, v in zip(keys, values.numpy())}


def _newest_checkpoint(directory: str) -> Optional[str]:
    from hvdkeras.checkpoint_files import newest_first

    if not os.path.isdir(directory):
        return None
    found = newest_first(os.listdir(directory))
    return os.path.join(directory, found[0][1]) if found else None


def run(recipe: dict, summary_json: Optional[str] = None) -> Dict[str, Any]:
    """Trains the recipe on this rank (hvdkeras.init() must have been called).

    Returns the summary dict (the same on every rank); rank 0 prints it.
    """
    import keras

    import hvdkeras
    from hvdkeras.output import fit_verbose

    started = time.perf_counter()
    rank, size = hvdkeras.rank(), hvdkeras.size()
    if recipe["seed"] is not None:
        keras.utils.set_random_seed(recipe["seed"])
    training = recipe["training"]
    precision = training["mixed_precision"]
    keras.config.set_dtype_policy("float32" if precision == "none" else precision)

    data = build_data(recipe, rank, size)
    batch = recipe["data"]["batch_size"]
    if training["steps_per_epoch"] is not None:
        steps_per_epoch = training["steps_per_epoch"]
    else:
        steps_per_epoch = agree_steps(data.train_examples // batch, "recipe_steps_per_epoch")
        if steps_per_epoch < 1:
            raise ValueError(
                f"a rank has fewer than data.batch_size={batch} training examples "
                f"({data.train_examples} on rank {rank}); lower the batch size or use fewer ranks")
    if training["steps"] is not None:
        total_batches = training["steps"]
        epochs = math.ceil(total_batches / steps_per_epoch)
    else:
        total_batches = None
        epochs = training["epochs"]
    planned_batches = total_batches if total_batches is not None else epochs * steps_per_epoch

    resolved = dict(recipe)
    resolved["data"] = dict(recipe["data"], input_shape=recipe["data"]["input_shape"] or data.input_shape)
    model = build_model(resolved)
    learning_rate, plan = make_learning_rate(recipe, size, steps_per_epoch, planned_batches)
    optimizer = make_optimizer(recipe, learning_rate)
    model.compile(optimizer=optimizer, loss=make_loss(training["loss"]),
                  metrics=[make_metric(m) for m in training["metrics"]],
                  steps_per_execution=training["steps_per_execution"])

    initial_epoch = 0
    checkpoint = recipe["checkpoint"]
    if checkpoint is not None and checkpoint["resume"]:
        initial_epoch = hvdkeras.restore_from_checkpoint(model, checkpoint["dir"], verbose=1)

    callbacks, throughput = make_callbacks(recipe, rank, steps_per_epoch, total_batches,
                                           batch * size)
    verbose = fit_verbose() if training["verbose"] == "auto" else (
        training["verbose"] if rank == 0 else 0)
    fit_started = time.perf_counter()
    history = model.fit(
        data.train, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=steps_per_epoch,
        validation_data=data.validation, validation_steps=training["validation_steps"],
        callbacks=callbacks, verbose=verbose, shuffle=False)  # the dataset shuffles
    fit_seconds = time.perf_counter() - fit_started

    logs = {k: [float(v) for v in values] for k, values in history.history.items()}
    epochs_run = len(next(iter(logs.values()), []))
    final = {k: values[-1] for k, values in logs.items() if values}
    if not epochs_run and data.validation is not None:
        final = _averaged_evaluation(model, data, training["validation_steps"])
    summary: Dict[str, Any] = {
        "name": recipe["name"],
        "ranks": size,
        "seconds": time.perf_counter() - started,
        "fit_seconds": fit_seconds,
        "initial_epoch": initial_epoch,
        "epochs": epochs,
        "epochs_run": epochs_run,
        "last_epoch": initial_epoch + epochs_run,
        "steps_per_epoch": steps_per_epoch,
        "global_batch": batch * size,
        "train_examples_per_rank": data.train_examples,
        "validation_examples_per_rank": data.validation_examples,
        "final": final,
        "history": logs,
        "examples_per_second": throughput.examples_per_second,
        "learning_rate_plan": {k: v for k, v in plan.items() if k != "schedule"},
        "checkpoint_dir": checkpoint["dir"] if checkpoint else None,
        "newest_checkpoint": _newest_checkpoint(checkpoint["dir"]) if checkpoint else None,
        "csv_log": (recipe["callbacks"]["csv_logger"] or {}).get("path"),
        "tensorboard_dir": (recipe["callbacks"]["tensorboard"] or {}).get("log_dir"),
        "timeline": recipe["engine"]["timeline"],
    }
    if rank == 0:
        print(format_summary(summary), flush=True)
        if summary_json:
            os.makedirs(os.path.dirname(os.path.abspath(summary_json)), exist_ok=True)
            with open(summary_json, "w") as f:
                json.dump(summary, f, indent=2)
    return summary


def _metric_line(values: Dict[str, float]) -> str:
    ordered = sorted(values, key=lambda k: (k.startswith("val_"), k != "loss", k))
    return "  ".join(f"{k} {values[k]:.4g}" for k in ordered if k != "learning_rate")


def format_summary(s: Dict[str, Any]) -> str:
    """The few lines rank 0 prints at the end of a run."""
    lines = [f"===== {s['name']}: finished in {s['seconds']:.1f} s on {s['ranks']} "
             f"rank{'s' if s['ranks'] != 1 else ''} ====="]
    if s["epochs_run"]:
        first = s["initial_epoch"] + 1
        resumed = f" (resumed after epoch {s['initial_epoch']})" if s["initial_epoch"] else ""
        lines.append(f"trained epochs {first}-{s['last_epoch']} of {s['epochs']}{resumed}: "
                     f"{s['steps_per_epoch']} steps per epoch, global batch {s['global_batch']}, "
                     f"{s['fit_seconds']:.1f} s in fit")
    else:
        lines.append(f"nothing left to train: the checkpoint already holds epoch "
                     f"{s['initial_epoch']} of {s['epochs']} (raise training.epochs or remove "
                     f"{s['checkpoint_dir']} to start over)")
    if s["final"]:
        label = f"epoch {s['last_epoch']}" if s["epochs_run"] else "evaluated now"
        lines.append(f"final metrics ({label}): {_metric_line(s['final'])}")
    lr = s["final"].get("learning_rate")
    if lr is not None:
        lines.append(f"learning rate at the end: {lr:.4g}")
    if s["examples_per_second"]:
        lines.append(f"throughput: {s['examples_per_second']:.1f} examples/s over all ranks")
    if s["checkpoint_dir"]:
        newest = s["newest_checkpoint"] or "none written"
        lines.append(f"checkpoints: {s['checkpoint_dir']} (newest: {os.path.basename(newest)})")
    for key, label in (("csv_log", "history CSV"), ("tensorboard_dir", "TensorBoard logs"),
                       ("timeline", "engine timeline")):
        if s.get(key):
            lines.append(f"{label}: {s[key]}")
    return "\n".join(f"hvdkeras: {line}" for line in lines)

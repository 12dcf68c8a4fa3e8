"""Running a validated recipe on this rank: optimizer, callbacks, fit, summary.

Call `run(recipe)` on every rank after `hvdkeras.init()` (the
`hvdkeras.recipes.run` module does both); rank 0 prints the summary.

What may import this module: `hvdkeras.recipes.run` (it imports TensorFlow).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable, Dict, Optional

import keras
import tensorflow as tf

from hvdkeras.collectives.reduction import allreduce
from hvdkeras.engine import world
from hvdkeras.engine.types import Average, Min
from hvdkeras.recipes.data import Data, build_data
from hvdkeras.recipes.keras_objects import (make_learning_rate, make_loss, make_metric,
                                            make_optimizer)
from hvdkeras.recipes.models import build_model
from hvdkeras.recipes.paths import run_dir_of
from hvdkeras.recipes.run_callbacks import make_callbacks
from hvdkeras.recipes.summary import format_summary
from hvdkeras.training.checkpoint_naming import newest_first
from hvdkeras.training.checkpoint_restore import TrainingPosition, restore_training_position
from hvdkeras.training.lr_variable import set_learning_rate
from hvdkeras.report.run_data import SUMMARY_NAME
from hvdkeras.runner.task_files import write_atomic
from hvdkeras.training.output import fit_verbose


def agree_steps(local: int, name: str) -> int:
    """The smallest `local` over all ranks (every rank must run as many steps)."""
    if world.size() == 1:
        return local
    value = allreduce(tf.constant(local, tf.int64), op=Min, name=name)
    return int(value.numpy())


def _averaged_evaluation(model, data: Data, steps: Optional[int]) -> Dict[str, float]:
    """Validation metrics averaged over ranks (used when no epoch ran)."""
    results = model.evaluate(data.validation, steps=steps, verbose=0, return_dict=True)
    keys = sorted(results)
    values = tf.constant([float(results[k]) for k in keys], tf.float64)
    if world.size() > 1:
        values = allreduce(values, op=Average, name="recipe_final_evaluation")
    return {f"val_{k}": float(v) for k, v in zip(keys, values.numpy())}


def _newest_checkpoint(directory: str) -> Optional[str]:
    if not os.path.isdir(directory):
        return None
    found = newest_first(os.listdir(directory))
    return os.path.join(directory, found[0][1]) if found else None


def _fit_from(model, data: Data, fresh_train: Callable[[], Any], position: TrainingPosition,
              epochs: int, steps_per_epoch: int, training: dict, callbacks: list,
              verbose: int) -> Dict[str, list]:
    """`model.fit` from `position` to `epochs`; returns the history's logs.

    The training stream is one sequence of batches (Note [exact resume] in
    hvdkeras/training/resume_state.py): a resumed run skips the batches the
    checkpoint already took, and a mid-epoch position first finishes that
    epoch with a fit of its remaining steps. The fit after that reads a
    dataset built anew (`fresh_train`): a second iterator of the same
    seeded shuffle would draw another order than the uninterrupted run's one
    iterator does.
    """
    common = dict(validation_data=data.validation, validation_steps=training["validation_steps"],
                  callbacks=callbacks, verbose=verbose, shuffle=False)  # the dataset shuffles
    logs: Dict[str, list] = {}
    epoch, step = position.epoch, position.step
    if step:
        _set_batch_offset(callbacks, step)
        taken = epoch * steps_per_epoch + step
        history = model.fit(data.train.skip(taken), epochs=epoch + 1, initial_epoch=epoch,
                            steps_per_epoch=steps_per_epoch - step, **common)
        _set_batch_offset(callbacks, 0)
        _extend(logs, history)
        epoch += 1
        if model.stop_training:
            return logs
    if epoch < epochs:
        train = data.train if step == 0 else fresh_train()
        if epoch:
            train = train.skip(epoch * steps_per_epoch)
        history = model.fit(train, epochs=epochs, initial_epoch=epoch,
                            steps_per_epoch=steps_per_epoch, **common)
        _extend(logs, history)
    return logs


def _on_this_world(position: TrainingPosition, size: int, steps_per_epoch: int,
                   announce: bool) -> TrainingPosition:
    """`position` for this run's world size (an elastic restart may change it).

    The learning rate and the shards already follow `size`; a mid-epoch step
    is carried over as the same fraction of the epoch (the data is sharded
    anew, so such a resume is not exact, unlike one on the same world size).
    """
    if not position.world_size or position.world_size == size:
        return position
    step = position.step
    if step and position.steps_per_epoch and position.steps_per_epoch != steps_per_epoch:
        step = min(steps_per_epoch - 1, step * steps_per_epoch // position.steps_per_epoch)
    if announce:
        moved = f"; step {position.step} of {position.steps_per_epoch} becomes step {step} of " \
                f"{steps_per_epoch}" if step != position.step else ""
        print(f"hvdkeras: the checkpoint was written by {position.world_size} rank(s), this run "
              f"has {size}: the learning rate and the data shards follow {size} rank(s){moved}.",
              flush=True)
    return position._replace(step=step, world_size=size, steps_per_epoch=steps_per_epoch)


def _set_batch_offset(callbacks: list, steps: int) -> None:
    """Tells the step-counting callbacks how many steps of the epoch ran before this fit()."""
    for callback in callbacks:
        if hasattr(callback, "batch_offset"):
            callback.batch_offset = steps


def _extend(logs: Dict[str, list], history) -> None:
    for key, values in history.history.items():
        logs.setdefault(key, []).extend(float(v) for v in values)


def run(recipe: dict, summary_json: Optional[str] = None) -> Dict[str, Any]:
    """Trains the recipe on this rank (hvdkeras.init() must have been called).

    Returns the summary dict (the same on every rank); rank 0 prints it.
    """
    started = time.perf_counter()
    rank, size = world.rank(), world.size()
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

    position = TrainingPosition(0, 0)
    checkpoint = recipe["checkpoint"]
    if checkpoint is not None and checkpoint["resume"]:
        position = restore_training_position(model, checkpoint["dir"], verbose=1)
        resized = position.world_size and position.world_size != size
        position = _on_this_world(position, size, steps_per_epoch, rank == 0)
        if resized and isinstance(learning_rate, (int, float)):
            # The checkpoint's optimizer holds the rate scaled for its world size.
            set_learning_rate(optimizer, learning_rate)
    initial_epoch = position.epoch

    callbacks, throughput = make_callbacks(recipe, rank, steps_per_epoch, total_batches,
                                           batch * size)
    verbose = fit_verbose() if training["verbose"] == "auto" else (
        training["verbose"] if rank == 0 else 0)
    fit_started = time.perf_counter()
    logs = _fit_from(model, data, lambda: build_data(recipe, rank, size).train, position, epochs,
                     steps_per_epoch, training, callbacks, verbose)
    fit_seconds = time.perf_counter() - fit_started

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
        text = json.dumps(summary, indent=2).encode()
        run_dir = run_dir_of(recipe)
        # `hvdkeras report` reads it.
        targets = [os.path.join(run_dir, SUMMARY_NAME)] if run_dir else []
        for path in targets + ([summary_json] if summary_json else []):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            write_atomic(path, text)
    return summary

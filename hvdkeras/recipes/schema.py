"""The recipe schema, version 1: what a recipe may contain, and its checks.

Pure Python (PyYAML only): nothing here imports TensorFlow or touches MPI,
so every rule is unit-tested directly. The data and optimizer sections are
in `schema_data` and `schema_optimizer`; `hvdkeras.recipes.validation`
checks a whole recipe against `RECIPE` and fills in every default; checks
that need Keras or the installed packages (names of optimizers and losses,
importable `module:function`, files that exist, tensorboard, tensorflow-io)
are in `hvdkeras.recipes.resolve`.

What may import this module: the rest of `hvdkeras.recipes`.

A recipe, with the defaults::

    version: 1                    # required
    name: <file name>             # shown in the summary
    description: ""
    seed: null                    # seeds Keras (weights, dropout) and shuffling
    model:                        # required
      name: ResNet50              # a keras.applications name, or module:function
      args: {}                    # keyword arguments
    data:
      source: bundled             # bundled | tfrecord | csv | parquet | synthetic | module:function
      batch_size: 32              # per rank
      ...                         # see DATA_KEYS_BY_SOURCE
    optimizer:
      name: adam                  # any keras.optimizers name
      args: {}
      learning_rate: 0.001
      scale_by_world_size: true
      warmup: null                # {epochs: E} or {steps: S}
      schedule: null              # {name: cosine | exponential | piecewise | polynomial | inverse_time | constant, ...}
      compression: none           # none | fp16 | bf16
      backward_passes_per_step: 1
    training: {epochs: 10, steps: null, steps_per_epoch: null, loss: ..., metrics: [accuracy],
               zero_stage: 0, ...}
    checkpoint: null              # {dir, keep: 3, best_only: false, monitor: val_loss, mode: auto, resume: true}
    callbacks: {early_stopping: null, tensorboard: null, csv_logger: null, gpu_stats: false}
    engine: {fusion_threshold: null, cycle_time_ms: null, timeline: null, autotune: null}
"""

from __future__ import annotations

import re
from typing import Any

from hvdkeras.recipes.schema_data import DATA
from hvdkeras.recipes.schema_optimizer import OPTIMIZER
from hvdkeras.recipes.spec import (INVALID, MODULE_FUNCTION, AnyMap, Bool, Context, Field, Float,
                                   Int, ListOf, Map, Nullable, Str, Union, given)
from hvdkeras.recipes.yaml_source import Document, Path

SCHEMA_VERSION = 1

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

PRECISIONS = ("none", "mixed_float16", "mixed_bfloat16")

# --------------------------------------------------------------------------
# Field specs
# --------------------------------------------------------------------------

_mode = Str(choices=("auto", "min", "max"))


class ByteSize(Int):
    """Bytes as an integer or a string with a unit: 64MiB, 1.5GB, 512KiB."""

    _UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000 ** 2, "mb": 1000 ** 2,
              "mib": 1024 ** 2, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1024 ** 3}
    _PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*$")

    def __init__(self) -> None:
        super().__init__(0, 1 << 40, what="a size in bytes")

    def describe(self) -> str:
        return "a size in bytes up to 1TiB (an integer, or a string like '64MiB')"

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if isinstance(value, str):
            match = self._PATTERN.match(value)
            unit = match.group(2).lower() if match else None
            if match is None or unit not in self._UNITS:
                ctx.error(path, f"{value!r} is not a size; expected {self.describe()} "
                                "(units: B, KB, KiB, MB, MiB, GB, GiB)")
                return INVALID
            value = int(float(match.group(1)) * self._UNITS[unit])
        return super().check(value, path, ctx)


def _named_with_args(what: str) -> Union:
    return Union(Str(what=what),
                 Map({"name": Field(Str(what=what), required=True),
                      "args": Field(AnyMap(), default={})}, what="a mapping"),
                 what=f"{what}, or a mapping {{name: ..., args: {{...}}}}")


def _check_model(value: dict, path: Path, ctx: Context) -> None:
    name = value["name"]
    if ":" in name:
        if not MODULE_FUNCTION.match(name):
            ctx.error(path + ("name",), f"{name!r} is not a valid 'module:function' "
                                        "(e.g. mypackage.models:build_model)")
    elif not _IDENTIFIER.match(name):
        ctx.error(path + ("name",), f"{name!r} is neither a keras.applications name (e.g. "
                                    "ResNet50) nor a 'module:function'")


MODEL = Map({
    "name": Field(Str(what="a keras.applications name or 'module:function'"), required=True,
                  help="a keras.applications name (ResNet50, MobileNetV2, ...) or a "
                       "'module:function' returning a Keras model"),
    "args": Field(AnyMap(), default={}, help="keyword arguments for the model function"),
}, what="the model section", post=_check_model)

class _Precision(Str):
    """none, mixed_float16, mixed_bfloat16; `false` means none."""

    def __init__(self) -> None:
        super().__init__(choices=PRECISIONS)

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        if value is False or value is None:
            return "none"
        if value is True:
            ctx.error(path, "say which: mixed_float16 (GPUs) or mixed_bfloat16 (TPUs, newer "
                            "GPUs and CPUs)")
            return INVALID
        return super().check(value, path, ctx)


# Bounds that no real run reaches and that keep counts in the range Keras
# and the learning-rate arithmetic handle exactly (an epochs of 1e30 would
# otherwise validate and then run "forever").
MAX_EPOCHS = 1_000_000
MAX_STEPS = 1_000_000_000

TRAINING = Map({
    "epochs": Field(Int(1, MAX_EPOCHS), default=10),
    "steps": Field(Nullable(Int(1, MAX_STEPS)), help="total steps instead of epochs"),
    "steps_per_epoch": Field(Nullable(Int(1, MAX_STEPS)), help="default: one pass over the shard"),
    "validation_steps": Field(Nullable(Int(1, MAX_STEPS))),
    "loss": Field(_named_with_args("a keras.losses name"),
                  default="sparse_categorical_crossentropy"),
    "metrics": Field(ListOf(_named_with_args("a keras.metrics name"), scalar_ok=True),
                     default=["accuracy"]),
    "mixed_precision": Field(_Precision(), default="none"),
    "steps_per_execution": Field(Int(1, MAX_STEPS), default=1),
    "zero_stage": Field(Int(0, 3), default=0,
                        help="shard across ranks: 1 (optimizer state), 2 (and gradients), 3 "
                             "(and weights); see docs/memory-scaling.md"),
    "verbose": Field(Union(Str(choices=("auto",)), Int(0, 2)), default="auto"),
}, what="the training section")

def _check_checkpoint(value: dict, path: Path, ctx: Context) -> None:
    if value["every_steps"] is not None and value["best_only"]:
        ctx.error(path + ("every_steps",), "cannot be combined with best_only (step checkpoints "
                  "are for resuming; best_only keeps files by a metric); choose one")


CHECKPOINT = Map({
    "dir": Field(Str(what="a directory"), required=True),
    "keep": Field(Nullable(Int(1)), default=3, help="newest checkpoints kept (null: all)"),
    "best_only": Field(Bool(), default=False),
    "monitor": Field(Str(what="an epoch-log key such as val_loss"), default="val_loss"),
    "mode": Field(_mode, default="auto"),
    "resume": Field(Bool(), default=True, help="continue from the newest checkpoint"),
    "every_steps": Field(Nullable(Int(1, MAX_STEPS)), default=None,
                         help="also save every N steps within an epoch; resume continues there"),
}, what="the checkpoint section", post=_check_checkpoint)

EARLY_STOPPING = Map({
    "monitor": Field(Str(what="an epoch-log key"), default="val_loss"),
    "patience": Field(Int(0), default=5),
    "min_delta": Field(Float(0.0), default=0.0),
    "mode": Field(_mode, default="auto"),
    "restore_best_weights": Field(Bool(), default=False),
    "start_from_epoch": Field(Int(0), default=0),
}, what="the early_stopping section")

TENSORBOARD = Map({
    "log_dir": Field(Str(what="a directory"), required=True),
    "update_freq": Field(Union(Str(choices=("epoch", "batch")), Int(1)), default="epoch"),
    "histogram_freq": Field(Int(0), default=0),
    "write_graph": Field(Bool(), default=False),
    "profile_batch": Field(Union(Int(0), ListOf(Int(0), min_len=2, max_len=2)), default=0),
}, what="the tensorboard section")

CSV_LOGGER = Map({
    "path": Field(Str(what="a file path"), required=True),
    "append": Field(Bool(), default=False),
    "separator": Field(Str(non_empty=False), default=","),
}, what="the csv_logger section")

CALLBACKS = Map({
    "early_stopping": Field(Nullable(EARLY_STOPPING)),
    "tensorboard": Field(Nullable(TENSORBOARD)),
    "csv_logger": Field(Nullable(CSV_LOGGER)),
    "gpu_stats": Field(Bool(), default=False,
                       help="each rank's GPU utilization, memory, power and temperature "
                            "in the epoch logs (NVML)"),
}, what="the callbacks section")

ENGINE = Map({
    "fusion_threshold": Field(Nullable(ByteSize()), help="HVDKERAS_FUSION_THRESHOLD (bytes)"),
    "cycle_time_ms": Field(Nullable(Float(0.0, 60000.0, low_open=True)),
                           help="HVDKERAS_CYCLE_TIME (milliseconds)"),
    "timeline": Field(Nullable(Str(what="a file path")), help="HVDKERAS_TIMELINE"),
    "autotune": Field(Nullable(Bool()), help="HVDKERAS_AUTOTUNE"),
}, what="the engine section")


class _Version(Int):
    def __init__(self) -> None:
        super().__init__(what="the schema version")

    def describe(self) -> str:
        return f"{SCHEMA_VERSION} (the only schema version so far)"

    def check(self, value: Any, path: Path, ctx: Context) -> Any:
        result = super().check(value, path, ctx)
        if result is not INVALID and result != SCHEMA_VERSION:
            ctx.error(path, f"version {result} is not supported; this hvdkeras reads "
                            f"version {SCHEMA_VERSION}")
            return INVALID
        return result


# The Keras backends a recipe can name (hvdkeras/engine/frameworks.py's SUPPORTED).
BACKENDS = ("tensorflow", "jax", "torch")


def _check_recipe(value: dict, path: Path, ctx: Context) -> None:
    training = value["training"]
    if given(ctx.doc.data, ("training", "epochs")) and training["steps"] is not None:
        epochs_set = _from_override(ctx.doc, ("training", "epochs"))
        steps_set = _from_override(ctx.doc, ("training", "steps"))
        if steps_set and not epochs_set:
            pass  # --set training.steps=N replaces the file's epochs
        elif epochs_set and not steps_set:
            training["steps"] = None  # --set training.epochs=N replaces the file's steps
        else:
            ctx.error(("training", "steps"), "set training.epochs or training.steps, not both")
    has_validation = value["data"]["validation"] is not None
    monitors = []
    if value["checkpoint"] is not None and value["checkpoint"]["best_only"]:
        monitors.append((("checkpoint", "monitor"), value["checkpoint"]["monitor"]))
    if value["callbacks"]["early_stopping"] is not None:
        monitors.append((("callbacks", "early_stopping", "monitor"),
                         value["callbacks"]["early_stopping"]["monitor"]))
    for where, monitor in monitors:
        if monitor.startswith("val_") and not has_validation:
            ctx.error(where, f"{monitor!r} needs validation data: set data.validation "
                             "(split or path), or monitor a training metric such as 'loss'")


RECIPE = Map({
    "version": Field(_Version(), required=True),
    "name": Field(Nullable(Str())),
    "description": Field(Str(non_empty=False), default=""),
    "seed": Field(Nullable(Int(0, 2 ** 31 - 1))),
    "backend": Field(Nullable(Str(choices=BACKENDS)),
                     help="the Keras backend every rank trains with (sets KERAS_BACKEND); "
                          "null: Keras's own setting"),
    "model": Field(MODEL, required=True),
    "data": Field(DATA, default={}),
    "optimizer": Field(OPTIMIZER, default={}),
    "training": Field(TRAINING, default={}),
    "checkpoint": Field(Nullable(CHECKPOINT)),
    "callbacks": Field(CALLBACKS, default={}),
    "engine": Field(ENGINE, default={}),
}, what="a recipe", post=_check_recipe)


def _from_override(doc: Document, path: Path) -> bool:
    """Whether the value at `path` was set with --set (itself or a parent)."""
    return any(tuple(path[:end]) in doc.origins for end in range(len(path), 0, -1))

"""The recipe schema, version 1: what a recipe may contain, and its checks.

Pure Python (PyYAML only): nothing here imports TensorFlow or touches MPI,
so every rule is unit-tested directly. `validate(doc)` returns the
normalized recipe (a plain nested dict with every default filled in) and the
list of problems; checks that need Keras or the installed packages (names of
optimizers and losses, importable `module:function`, files that exist,
tensorboard, tensorflow-io) are in `hvdkeras.recipes.resolve`.

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
    training: {epochs: 10, steps: null, steps_per_epoch: null, loss: ..., metrics: [accuracy], ...}
    checkpoint: null              # {dir, keep: 3, best_only: false, monitor: val_loss, mode: auto, resume: true}
    callbacks: {early_stopping: null, tensorboard: null, csv_logger: null}
    engine: {fusion_threshold: null, cycle_time_ms: null, timeline: null, autotune: null}
"""

from __future__ import annotations

import os
import re
from pathlib import Path as FsPath
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hvdkeras.recipes.spec import (INVALID, AnyMap, Bool, Context, Field, Float, Int, Issue,
                                   ListOf, Map, Nullable, Str, Union, did_you_mean, dotted,
                                   given, require_one_of)
from hvdkeras.recipes.yaml_source import Document, Path

SCHEMA_VERSION = 1

BUNDLED_DATA_DIR = FsPath(__file__).resolve().parent.parent / "data"
BUNDLED_PLACEHOLDER = "{bundled}"

FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_FUNCTION = re.compile(FUNCTION_PATTERN)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

FILE_SOURCES = ("tfrecord", "csv", "parquet")
DATA_SOURCES = ("bundled",) + FILE_SOURCES + ("synthetic",)
BUNDLED_DATASETS = ("digits",)
SCHEDULES = ("constant", "cosine", "exponential", "inverse_time", "piecewise", "polynomial")
COMPRESSIONS = ("none", "fp16", "bf16")
PRECISIONS = ("none", "mixed_float16", "mixed_bfloat16")

TF_IO_MESSAGE = (
    "the parquet source needs tensorflow-io, which runs only on TensorFlow 2.16-2.17 with "
    "tensorflow-io 0.37.1 (pip install \"tensorflow==2.17.1\" \"hvdkeras[io]\")"
)

# --------------------------------------------------------------------------
# Field specs
# --------------------------------------------------------------------------

_path_list = ListOf(Str(what="a file path or glob"), min_len=1, scalar_ok=True,
                    what="a file path or glob, or a list of them")
_shape = ListOf(Int(1), min_len=1, what="a shape: a list of positive integers, e.g. [8, 8, 1]")
_column = Union(Int(0, what="a column index"), Str(what="a column name"),
                what="a column name or index")
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
        if not _FUNCTION.match(name):
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

FEATURE = Map({
    "shape": Field(ListOf(Int(1)), default=[], help="the feature's shape ([] for a scalar)"),
    "dtype": Field(Str(choices=("float32", "int64", "string")), default="float32"),
}, what="a feature description")

VALIDATION = Map({
    "split": Field(Nullable(Float(0.0, 1.0, low_open=True, high_open=True)),
                   help="fraction of the data held out for validation"),
    "path": Field(Nullable(_path_list), help="a separate validation set (file sources)"),
}, what="the validation section")

# Which data keys each source reads (beyond the common ones).
DATA_KEYS_BY_SOURCE: Dict[str, Tuple[str, ...]] = {
    "bundled": ("name", "layout"),
    "tfrecord": ("path", "compression", "features", "label", "input_shape", "num_classes",
                 "scale"),
    "csv": ("path", "compression", "label", "columns", "header", "input_shape", "num_classes",
            "scale"),
    "parquet": ("path", "label", "columns", "input_shape", "num_classes", "scale"),
    "synthetic": ("samples", "input_shape", "num_classes"),
    "function": ("args", "input_shape", "num_classes"),
}
DATA_COMMON_KEYS = ("source", "batch_size", "shuffle", "shuffle_buffer", "seed", "shard",
                    "cache", "validation")


def data_source_kind(source: str) -> str:
    """'function' for a module:function source, else the source name."""
    return "function" if ":" in source else source


def _check_data(value: dict, path: Path, ctx: Context) -> None:
    source = value["source"]
    kind = data_source_kind(source)
    if kind == "function" and not _FUNCTION.match(source):
        ctx.error(path + ("source",), f"{source!r} is not a valid 'module:function'")
        return
    if kind != "function" and kind not in DATA_SOURCES:
        ctx.error(path + ("source",), f"{source!r} is not a data source"
                                      f"{did_you_mean(source, DATA_SOURCES)}; expected one of "
                                      f"{', '.join(DATA_SOURCES)}, or a 'module:function' "
                                      "returning a tf.data.Dataset")
        return
    allowed = set(DATA_COMMON_KEYS) | set(DATA_KEYS_BY_SOURCE[kind])
    raw = _raw_at(ctx, path)
    for key in value:
        if key not in allowed and isinstance(raw, dict) and key in raw and raw[key] is not None:
            ctx.error(path + (key,), f"is not used by source {source!r}; keys for "
                                     f"{kind if kind != 'function' else 'a module:function'} "
                                     f"sources: {', '.join(DATA_KEYS_BY_SOURCE[kind])} (and "
                                     f"{', '.join(DATA_COMMON_KEYS)})")
    # Defaults that depend on the source.
    if kind in FILE_SOURCES:
        if value["path"] is None:
            ctx.error(path, f"source {source!r} needs 'path' (a file, glob or list of them)")
        if value["label"] is None:
            value["label"] = "label"
    if kind == "tfrecord":
        if not value["features"]:
            ctx.error(path, "source 'tfrecord' needs 'features': the name, shape and dtype of "
                            "each feature, e.g. {image: {shape: [64]}, label: {dtype: int64}}")
        elif value["label"] not in value["features"]:
            ctx.error(path + ("label",), f"{value['label']!r} is not one of the features "
                                         f"({', '.join(value['features'])})")
    if kind == "csv":
        if value["header"] is None:
            value["header"] = True
        if not value["header"]:
            names = [c for c in [value["label"], *(value["columns"] or [])] if isinstance(c, str)]
            if names:
                ctx.error(path + ("header",), "with header: false the columns have no names: "
                                              "give label and columns as column indices "
                                              f"(found the name {names[0]!r})")
    if kind == "parquet":
        for key in ("label",):
            if isinstance(value[key], int):
                ctx.error(path + (key,), "parquet columns are named: give the column name")
    if kind == "bundled":
        value["name"] = value["name"] or "digits"
        value["layout"] = value["layout"] or "image"
        value["num_classes"] = 10
        value["input_shape"] = [8, 8, 1] if value["layout"] == "image" else [64]
    if kind == "synthetic":
        if value["input_shape"] is None:
            ctx.error(path, "source 'synthetic' needs 'input_shape' (one sample's shape, "
                            "e.g. [224, 224, 3])")
        value["num_classes"] = value["num_classes"] or 10
        value["samples"] = value["samples"] or 1024
    if value["compression"] is None and kind in ("tfrecord", "csv"):
        value["compression"] = "auto"
    validation = value["validation"]
    if validation is not None:
        which = require_one_of(validation, ("split", "path"), path + ("validation",), ctx)
        if which == "path" and kind not in FILE_SOURCES:
            ctx.error(path + ("validation", "path"),
                      f"a separate validation file needs a file source (tfrecord, csv, parquet); "
                      f"with source {source!r} use validation.split")


DATA = Map({
    "source": Field(Str(what="bundled, tfrecord, csv, parquet, synthetic or 'module:function'"),
                    default="bundled"),
    "batch_size": Field(Int(1, 1 << 20), default=32, help="examples per rank per step"),
    "shuffle": Field(Bool(), default=True),
    "shuffle_buffer": Field(Int(1), default=10000),
    "seed": Field(Nullable(Int(0, 2 ** 31 - 1)), help="shuffle seed (default: the recipe seed)"),
    "shard": Field(Bool(), default=True, help="each rank reads every size-th example"),
    "cache": Field(Bool(), default=False, help="cache the decoded examples in memory"),
    "validation": Field(Nullable(VALIDATION)),
    # bundled
    "name": Field(Nullable(Str(choices=BUNDLED_DATASETS))),
    "layout": Field(Nullable(Str(choices=("image", "flat")))),
    # files
    "path": Field(Nullable(_path_list)),
    "compression": Field(Nullable(Str(choices=("auto", "none", "gzip", "zlib")))),
    "features": Field(Nullable(AnyMap(FEATURE, what="a mapping of feature name: {shape, dtype}"))),
    "label": Field(Nullable(_column)),
    "columns": Field(Nullable(ListOf(_column, min_len=1))),
    "header": Field(Nullable(Bool())),
    "input_shape": Field(Nullable(_shape)),
    "num_classes": Field(Nullable(Int(1))),
    "scale": Field(Nullable(Float()), help="multiply the features by this"),
    # synthetic
    "samples": Field(Nullable(Int(1)), help="synthetic examples per rank per epoch"),
    # module:function
    "args": Field(Nullable(AnyMap())),
}, what="the data section", post=_check_data)


def _check_warmup(value: dict, path: Path, ctx: Context) -> None:
    require_one_of(value, ("epochs", "steps"), path, ctx)


WARMUP = Map({
    "epochs": Field(Nullable(Float(0.0, low_open=True))),
    "steps": Field(Nullable(Int(1))),
}, what="the warmup section ({epochs: E} or {steps: S})", post=_check_warmup)

SCHEDULE_KEYS: Dict[str, Tuple[str, ...]] = {
    "constant": (),
    "cosine": ("decay_steps", "decay_epochs", "alpha"),
    "exponential": ("decay_rate", "decay_steps", "decay_epochs", "staircase"),
    "inverse_time": ("decay_rate", "decay_steps", "decay_epochs", "staircase"),
    "piecewise": ("boundaries", "boundary_epochs", "multipliers"),
    "polynomial": ("decay_steps", "decay_epochs", "end_multiplier", "power"),
}


def _check_schedule(value: dict, path: Path, ctx: Context) -> None:
    name = value["name"]
    raw = _raw_at(ctx, path)
    for key in value:
        if key != "name" and key not in SCHEDULE_KEYS[name] and isinstance(raw, dict) \
                and raw.get(key) is not None:
            keys = ", ".join(SCHEDULE_KEYS[name]) or "none"
            ctx.error(path + (key,), f"is not used by the {name!r} schedule; its keys: {keys}")
    if {"decay_steps", "decay_epochs"} & set(SCHEDULE_KEYS[name]):
        require_one_of(value, ("decay_steps", "decay_epochs"), path, ctx, at_most=True)
    if name in ("exponential", "inverse_time"):
        if value["decay_rate"] is None:
            ctx.error(path, f"the {name!r} schedule needs 'decay_rate'")
        if value["decay_steps"] is None and value["decay_epochs"] is None:
            value["decay_epochs"] = 1.0
        if value["staircase"] is None:
            value["staircase"] = False
    if name == "cosine" and value["alpha"] is None:
        value["alpha"] = 0.0
    if name == "polynomial":
        value["end_multiplier"] = 1e-4 if value["end_multiplier"] is None else value["end_multiplier"]
        value["power"] = 1.0 if value["power"] is None else value["power"]
    if name == "piecewise":
        which = require_one_of(value, ("boundaries", "boundary_epochs"), path, ctx)
        multipliers = value["multipliers"]
        if multipliers is None:
            ctx.error(path, "the 'piecewise' schedule needs 'multipliers' (one more than "
                            "boundaries): the learning rate in each piece is learning_rate * m")
        elif which is not None:
            bounds = value[which]
            if len(multipliers) != len(bounds) + 1:
                ctx.error(path + ("multipliers",), f"has {len(multipliers)} values; with "
                                                  f"{len(bounds)} {which} it needs "
                                                  f"{len(bounds) + 1}")
            if any(later <= earlier for earlier, later in zip(bounds, bounds[1:])):
                ctx.error(path + (which,), f"must increase strictly, got {bounds}")


SCHEDULE = Map({
    "name": Field(Str(choices=SCHEDULES), required=True),
    "decay_steps": Field(Nullable(Int(1))),
    "decay_epochs": Field(Nullable(Float(0.0, low_open=True))),
    "alpha": Field(Nullable(Float(0.0, 1.0)), help="cosine: final rate as a fraction"),
    "decay_rate": Field(Nullable(Float(0.0, low_open=True))),
    "staircase": Field(Nullable(Bool())),
    "boundaries": Field(Nullable(ListOf(Int(1), min_len=1))),
    "boundary_epochs": Field(Nullable(ListOf(Float(0.0, low_open=True), min_len=1))),
    "multipliers": Field(Nullable(ListOf(Float(0.0), min_len=1))),
    "end_multiplier": Field(Nullable(Float(0.0))),
    "power": Field(Nullable(Float(0.0, low_open=True))),
}, what="the schedule section", post=_check_schedule)


def _check_optimizer(value: dict, path: Path, ctx: Context) -> None:
    for key in ("learning_rate", "lr"):
        if key in value["args"]:
            ctx.error(path + ("args", key), "set the rate with optimizer.learning_rate (it is "
                                            "scaled by the world size and scheduled)")


OPTIMIZER = Map({
    "name": Field(Str(what="a keras.optimizers name"), default="adam"),
    "args": Field(AnyMap(), default={}),
    "learning_rate": Field(Float(0.0, low_open=True), default=0.001),
    "scale_by_world_size": Field(Bool(), default=True,
                                 help="multiply learning_rate by the number of ranks"),
    "warmup": Field(Nullable(WARMUP)),
    "schedule": Field(Nullable(SCHEDULE)),
    "compression": Field(Str(choices=COMPRESSIONS), default="none"),
    "backward_passes_per_step": Field(Int(1, 1 << 16), default=1),
}, what="the optimizer section", post=_check_optimizer)


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


TRAINING = Map({
    "epochs": Field(Int(1), default=10),
    "steps": Field(Nullable(Int(1)), help="total steps instead of epochs"),
    "steps_per_epoch": Field(Nullable(Int(1)), help="default: one pass over the shard"),
    "validation_steps": Field(Nullable(Int(1))),
    "loss": Field(_named_with_args("a keras.losses name"),
                  default="sparse_categorical_crossentropy"),
    "metrics": Field(ListOf(_named_with_args("a keras.metrics name"), scalar_ok=True),
                     default=["accuracy"]),
    "mixed_precision": Field(_Precision(), default="none"),
    "steps_per_execution": Field(Int(1), default=1),
    "verbose": Field(Union(Str(choices=("auto",)), Int(0, 2)), default="auto"),
}, what="the training section")

CHECKPOINT = Map({
    "dir": Field(Str(what="a directory"), required=True),
    "keep": Field(Nullable(Int(1)), default=3, help="newest checkpoints kept (null: all)"),
    "best_only": Field(Bool(), default=False),
    "monitor": Field(Str(what="an epoch-log key such as val_loss"), default="val_loss"),
    "mode": Field(_mode, default="auto"),
    "resume": Field(Bool(), default=True, help="continue from the newest checkpoint"),
}, what="the checkpoint section")

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


def _raw_at(ctx: Context, path: Path) -> Any:
    node = ctx.doc.data
    for part in path:
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        else:
            return None
    return node


# --------------------------------------------------------------------------
# Whole-recipe validation
# --------------------------------------------------------------------------


class RecipeError(Exception):
    """A recipe with problems; `issues` lists them (file:line: field: what)."""

    def __init__(self, issues: Sequence[Issue]) -> None:
        self.issues = list(issues)
        super().__init__(format_issues(self.issues))


def format_issues(issues: Sequence[Issue]) -> str:
    count = len(issues)
    head = f"the recipe has {count} problem{'s' if count != 1 else ''}:"
    return "\n".join([head] + [f"  {issue}" for issue in issues])


def validate(doc: Document, recipe_path: Optional[str] = None,
             cwd: Optional[str] = None) -> Tuple[Optional[dict], List[Issue]]:
    """Checks `doc` against schema version 1.

    Args:
        doc: The parsed recipe (with `--set` overrides applied).
        recipe_path: The recipe file; relative input paths (data.path,
            data.validation.path) are relative to its directory, and the
            name defaults to its stem.
        cwd: The directory output paths (checkpoint.dir, log files,
            engine.timeline) are relative to; default the current one.

    Returns:
        (the normalized recipe, []) or (None, the problems).
    """
    ctx = Context(doc)
    for path, message in doc.duplicates:
        ctx.error(path, message)
    result = RECIPE.check(doc.data, (), ctx)
    if ctx.issues or result is INVALID:
        return None, ctx.issues
    base = FsPath(recipe_path).resolve().parent if recipe_path else FsPath.cwd()
    if result["name"] is None:
        result["name"] = FsPath(recipe_path).stem if recipe_path else "recipe"
    if result["data"]["seed"] is None:
        result["data"]["seed"] = result["seed"]
    resolve_paths(result, base, FsPath(cwd) if cwd else FsPath.cwd())
    return result, []


def expand_input_path(path: str, base: FsPath) -> str:
    """`{bundled}/x` -> the package's data dir; relative -> relative to `base`."""
    if path.startswith(BUNDLED_PLACEHOLDER):
        path = str(BUNDLED_DATA_DIR) + path[len(BUNDLED_PLACEHOLDER):]
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else str(base / path)


def _output_path(path: str, cwd: FsPath) -> str:
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else str(cwd / path)


def resolve_paths(recipe: dict, base: FsPath, cwd: FsPath) -> None:
    """Makes every path in `recipe` absolute (in place)."""
    data = recipe["data"]
    if data["path"] is not None:
        data["path"] = [expand_input_path(p, base) for p in data["path"]]
    if data["validation"] is not None and data["validation"]["path"] is not None:
        data["validation"]["path"] = [expand_input_path(p, base) for p in data["validation"]["path"]]
    if recipe["checkpoint"] is not None:
        recipe["checkpoint"]["dir"] = _output_path(recipe["checkpoint"]["dir"], cwd)
    callbacks = recipe["callbacks"]
    if callbacks["tensorboard"] is not None:
        callbacks["tensorboard"]["log_dir"] = _output_path(callbacks["tensorboard"]["log_dir"], cwd)
    if callbacks["csv_logger"] is not None:
        callbacks["csv_logger"]["path"] = _output_path(callbacks["csv_logger"]["path"], cwd)
    if recipe["engine"]["timeline"] is not None:
        recipe["engine"]["timeline"] = _output_path(recipe["engine"]["timeline"], cwd)


# --------------------------------------------------------------------------
# Engine knobs -> environment
# --------------------------------------------------------------------------


def engine_env(recipe: dict) -> Dict[str, str]:
    """The HVDKERAS_* variables for the recipe's engine section (set ones only)."""
    from hvdkeras import config

    engine = recipe["engine"]
    env: Dict[str, str] = {}
    if engine["fusion_threshold"] is not None:
        env[config.FUSION_THRESHOLD] = str(int(engine["fusion_threshold"]))
    if engine["cycle_time_ms"] is not None:
        env[config.CYCLE_TIME] = repr(float(engine["cycle_time_ms"]))
    if engine["timeline"] is not None:
        env[config.TIMELINE] = engine["timeline"]
    if engine["autotune"] is not None:
        env[config.AUTOTUNE] = "1" if engine["autotune"] else "0"
    return env


# --------------------------------------------------------------------------
# Schedule arithmetic (plain numbers; the Keras objects are built in training.py)
# --------------------------------------------------------------------------


def steps_from(value_steps: Optional[int], value_epochs: Optional[float],
               updates_per_epoch: float) -> Optional[int]:
    """A length given in steps or epochs, in optimizer steps (at least 1)."""
    if value_steps is not None:
        return int(value_steps)
    if value_epochs is not None:
        return max(1, int(round(value_epochs * updates_per_epoch)))
    return None


def schedule_plan(recipe: dict, size: int, steps_per_epoch: int,
                  total_batches: int) -> Dict[str, Any]:
    """The numbers behind the learning rate: base rate, warmup length, decay.

    Args:
        recipe: A normalized recipe.
        size: The number of ranks.
        steps_per_epoch: Batches per epoch on each rank.
        total_batches: Batches the run takes in all (epochs x steps, or
            training.steps).

    Returns:
        {"base": scaled learning rate, "warmup_steps": int (0: none),
         "schedule": the schedule section or None, "decay_steps": int or None,
         "boundaries": list of int or None, "updates_per_epoch": float,
         "total_updates": int}. Steps here are optimizer updates (batches
         divided by backward_passes_per_step).
    """
    opt = recipe["optimizer"]
    passes = opt["backward_passes_per_step"]
    updates_per_epoch = steps_per_epoch / passes
    total_updates = max(1, total_batches // passes)
    base = opt["learning_rate"] * (size if opt["scale_by_world_size"] else 1)
    warmup = opt["warmup"]
    warmup_steps = 0
    if warmup is not None:
        warmup_steps = steps_from(warmup["steps"], warmup["epochs"], updates_per_epoch) or 0
    plan: Dict[str, Any] = {"base": base, "warmup_steps": warmup_steps,
                            "schedule": opt["schedule"], "decay_steps": None,
                            "boundaries": None, "updates_per_epoch": updates_per_epoch,
                            "total_updates": total_updates}
    schedule = opt["schedule"]
    if schedule is not None:
        decay = steps_from(schedule.get("decay_steps"), schedule.get("decay_epochs"),
                           updates_per_epoch)
        if decay is None and schedule["name"] in ("cosine", "polynomial"):
            decay = max(1, total_updates - warmup_steps)
        plan["decay_steps"] = decay
        if schedule["name"] == "piecewise":
            if schedule["boundaries"] is not None:
                plan["boundaries"] = list(schedule["boundaries"])
            else:
                plan["boundaries"] = [steps_from(None, e, updates_per_epoch)
                                      for e in schedule["boundary_epochs"]]
    return plan


def learning_rate_at(plan: Dict[str, Any], step: int, size: int) -> float:
    """The learning rate the plan gives at optimizer step `step` (pure math).

    The reference the tests compare the Keras schedule against.
    """
    import math

    base, warmup = plan["base"], plan["warmup_steps"]
    if warmup and step < warmup:
        return base / size * (step * (size - 1) / warmup + 1.0)
    t = step - warmup
    schedule = plan["schedule"]
    if schedule is None or schedule["name"] == "constant":
        return base
    name, decay = schedule["name"], plan["decay_steps"]
    if name == "cosine":
        progress = min(t, decay) / decay
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return base * ((1 - schedule["alpha"]) * cosine + schedule["alpha"])
    if name == "exponential":
        p = t / decay
        if schedule["staircase"]:
            p = math.floor(p)
        return base * schedule["decay_rate"] ** p
    if name == "inverse_time":
        p = t / decay
        if schedule["staircase"]:
            p = math.floor(p)
        return base / (1 + schedule["decay_rate"] * p)
    if name == "polynomial":
        end = base * schedule["end_multiplier"]
        p = min(t, decay) / decay
        return (base - end) * (1 - p) ** schedule["power"] + end
    if name == "piecewise":
        multipliers = schedule["multipliers"]
        for boundary, multiplier in zip(plan["boundaries"], multipliers):
            if t <= boundary:
                return base * multiplier
        return base * multipliers[-1]
    raise ValueError(f"unknown schedule {name!r}")  # pragma: no cover


__all__ = [
    "DATA_KEYS_BY_SOURCE", "RecipeError", "SCHEMA_VERSION", "TF_IO_MESSAGE", "engine_env",
    "format_issues", "learning_rate_at", "schedule_plan", "validate", "dotted", "did_you_mean",
]

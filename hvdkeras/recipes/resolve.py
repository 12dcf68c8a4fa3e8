"""Checks of a valid recipe against this environment, before any process starts.

`hvdkeras.recipes.validation` checks the recipe's shape without importing anything heavy;
these checks look names up in Keras (models, optimizers and their arguments,
losses, metrics: `resolve_keras`, or the cached `keras_catalog` of them),
import `module:function` targets, open the data files at their head and tail
(`data_checks`), check that output folders can be made, and check optional
packages (tensorboard, tensorflow-io). Problems come back as
`Issue`s with the same file:line locations, so `hvdkeras train` can refuse a
recipe (exit code 2) before it launches anything. No MPI, no TensorFlow ops.

What may import this module: `hvdkeras.recipes.load_recipe`, lazily. It
imports Keras only when the catalogue of Keras names (`keras_catalog`)
cannot vouch for the recipe's names (`resolve_keras` then checks them).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import zlib
from typing import List, Optional

from hvdkeras.engine.config import engine_config_from_env
from hvdkeras.recipes import data_checks, data_files, keras_catalog
from hvdkeras.recipes.launching import engine_env
from hvdkeras.recipes.schema_data import FILE_SOURCES, TF_IO_MESSAGE, data_source_kind
from hvdkeras.recipes.spec import Context, Issue
from hvdkeras.recipes.user_code import import_target
from hvdkeras.recipes.yaml_source import Document
from hvdkeras.training.checkpoint_naming import newest_first

# tensorflow-io release -> the TensorFlow versions its ops load on.
TF_IO_COMPATIBLE = {"0.37": ("2.16", "2.17")}


def installed_tensorflow_version() -> Optional[str]:
    """The TensorFlow version, without importing it if it is not loaded yet."""
    module = sys.modules.get("tensorflow")
    if module is not None and getattr(module, "__version__", None):
        return module.__version__
    for distribution in ("tensorflow", "tensorflow-cpu", "tf-nightly"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def tensorflow_io_problem() -> Optional[str]:
    """Why tensorflow-io cannot work here (None if it should).

    A tensorflow-io release this table does not know is given the benefit of
    the doubt; reading the data then says exactly what failed.
    """
    if importlib.util.find_spec("tensorflow_io") is None:
        return f"{TF_IO_MESSAGE}; tensorflow-io is not installed"
    try:
        io_version = importlib.metadata.version("tensorflow-io")
    except importlib.metadata.PackageNotFoundError:
        return None
    compatible = TF_IO_COMPATIBLE.get(".".join(io_version.split(".")[:2]))
    version = installed_tensorflow_version() or "unknown"
    if compatible and not version.startswith(tuple(v + "." for v in compatible)):
        return (f"{TF_IO_MESSAGE}; this environment has TensorFlow {version}, where "
                f"the ops of tensorflow-io {io_version} fail to load")
    return None


def tensorboard_problem() -> Optional[str]:
    if importlib.util.find_spec("tensorboard") is None:
        return ("needs the 'tensorboard' package, which is not installed (TensorFlow 2.21 no "
                "longer installs it): pip install tensorboard")
    return None


def _check_data(recipe: dict, out: Context, world_size: Optional[int]) -> None:
    data = recipe["data"]
    kind = data_source_kind(data["source"])
    if kind == "function":
        import_target(data["source"], ("data", "source"), out, "data.source")
        return
    if kind == "bundled":
        _check_shards(data, data_files.DIGITS_EXAMPLES, out, world_size)
        return
    if kind == "parquet":
        problem = tensorflow_io_problem()
        if problem:
            out.error(("data", "source"), problem)
    if kind not in FILE_SOURCES:
        return
    lists = [(("data", "path"), data["path"])]
    if data["validation"] is not None and data["validation"]["path"]:
        lists.append((("data", "validation", "path"), data["validation"]["path"]))
    for path, patterns in lists:
        for index, pattern in enumerate(patterns):
            if not data_files.expand_paths([pattern]):
                out.error(path + (index,) if len(patterns) > 1 else path,
                          f"no file matches {pattern!r}")
    if out.issues or kind == "parquet":
        return
    total = 0
    for path, patterns in lists:
        files = data_files.expand_paths(patterns)
        compression = data_files.compression_for(data["compression"], files)
        count: Optional[int] = 0
        for name in files:
            try:
                if kind == "csv":
                    first = data_files.read_first_line(name, compression)
                    columns = data_files.csv_columns(data, first)[0]
                    found, problem = data_checks.check_csv(name, compression, data["header"],
                                                           columns)
                else:
                    found, problem = data_checks.check_tfrecord(name, compression)
            except data_files.DataError as error:
                out.error(("data", error.field or "path"), f"{name}: {error.message}")
                return
            except (OSError, EOFError, zlib.error) as error:
                out.error(path, f"cannot read {name}: {error}")
                return
            if problem:
                out.error(path, problem)
                return
            count = None if count is None or found is None else count + found
        if path == ("data", "path"):
            total = count
    _check_shards(data, total, out, world_size)


def _check_shards(data: dict, examples: Optional[int], out: Context,
                  world_size: Optional[int]) -> None:
    """A per-rank batch that the smallest rank's training shard cannot fill is an error."""
    if examples is None or not world_size:
        return
    fraction = (data["validation"] or {}).get("split") or 0.0
    train = examples - int(data_files.validation_mask(examples, fraction).sum()) if fraction \
        else examples
    shard = data_files.shard_size(train, world_size - 1, world_size) if data["shard"] else train
    if shard < data["batch_size"]:
        out.error(("data", "batch_size"),
                  f"{data['batch_size']} per rank does not fit: {train} training examples over "
                  f"{world_size} rank(s) leave {shard} on the smallest shard, so no full batch "
                  "could ever be made; lower data.batch_size or use fewer ranks")


def _check_outputs(recipe: dict, out: Context) -> None:
    callbacks = recipe["callbacks"]
    folders = []
    if recipe["checkpoint"] is not None:
        folders.append((("checkpoint", "dir"), recipe["checkpoint"]["dir"]))
    if callbacks["tensorboard"] is not None:
        folders.append((("callbacks", "tensorboard", "log_dir"), callbacks["tensorboard"]["log_dir"]))
    if callbacks["csv_logger"] is not None:
        folders.append((("callbacks", "csv_logger", "path"),
                        os.path.dirname(callbacks["csv_logger"]["path"])))
    if recipe["engine"]["timeline"] is not None:
        folders.append((("engine", "timeline"), os.path.dirname(recipe["engine"]["timeline"])))
    for path, folder in folders:
        problem = data_checks.writable_dir_problem(folder)
        if problem:
            out.error(path, problem)
    checkpoint = recipe["checkpoint"]
    if checkpoint is not None and os.path.exists(checkpoint["dir"]):
        if not os.path.isdir(checkpoint["dir"]):
            out.error(("checkpoint", "dir"), f"{checkpoint['dir']} exists and is not a directory")
        elif not checkpoint["resume"]:
            found = newest_first(os.listdir(checkpoint["dir"]))
            if found:
                out.error(("checkpoint", "resume"),
                          f"is false, but {checkpoint['dir']} already holds checkpoints (newest "
                          f"{found[0][1]}), which new ones would mix with; remove them, choose "
                          "another checkpoint.dir, or resume: true")
    if recipe["callbacks"]["tensorboard"] is not None:
        problem = tensorboard_problem()
        if problem:
            out.error(("callbacks", "tensorboard"), problem)


def _check_engine(recipe: dict, out: Context) -> None:
    try:
        engine_config_from_env(engine_env(recipe))
    except ValueError as error:
        out.error(("engine",), str(error))


def resolve(recipe: dict, doc: Document, world_size: Optional[int] = None) -> List[Issue]:
    """Environment checks of a normalized recipe; returns the problems found.

    `world_size` (the ranks it will run on, when known) adds the check that a
    per-rank batch fits every rank's shard.
    """
    out = Context(doc)
    if not keras_catalog.vouches_for(recipe, keras_catalog.current()):
        from hvdkeras.recipes.resolve_keras import check_names  # lazy: imports Keras

        check_names(recipe, out)
    _check_data(recipe, out, world_size)
    _check_outputs(recipe, out)
    _check_engine(recipe, out)
    return out.issues

"""The recipe schema's data section: sources and the keys each one reads.

What may import this module: `hvdkeras.recipes.schema` and the recipe code
that reads data (pure Python, PyYAML only).
"""

from __future__ import annotations

from pathlib import Path as FsPath
from typing import Dict, Tuple

from hvdkeras.recipes.spec import (MODULE_FUNCTION, AnyMap, Bool, Context, Field, Float, Int,
                                   ListOf, Map, Nullable, Str, Union, did_you_mean,
                                   require_one_of)
from hvdkeras.recipes.yaml_source import Path

BUNDLED_DATA_DIR = FsPath(__file__).resolve().parent.parent / "data"

FILE_SOURCES = ("tfrecord", "csv", "parquet")
DATA_SOURCES = ("bundled",) + FILE_SOURCES + ("synthetic",)
BUNDLED_DATASETS = ("digits",)

TF_IO_MESSAGE = (
    "the parquet source needs tensorflow-io, which runs only on TensorFlow 2.16-2.17 with "
    "tensorflow-io 0.37.1 (pip install \"tensorflow==2.17.1\" \"hvdkeras[io]\")"
)

_path_list = ListOf(Str(what="a file path or glob"), min_len=1, scalar_ok=True,
                    what="a file path or glob, or a list of them")
_shape = ListOf(Int(1), min_len=1, what="a shape: a list of positive integers, e.g. [8, 8, 1]")
_column = Union(Int(0, what="a column index"), Str(what="a column name"),
                what="a column name or index")

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
    if kind == "function" and not MODULE_FUNCTION.match(source):
        ctx.error(path + ("source",), f"{source!r} is not a valid 'module:function'")
        return
    if kind != "function" and kind not in DATA_SOURCES:
        ctx.error(path + ("source",), f"{source!r} is not a data source"
                                      f"{did_you_mean(source, DATA_SOURCES)}; expected one of "
                                      f"{', '.join(DATA_SOURCES)}, or a 'module:function' "
                                      "returning a tf.data.Dataset")
        return
    allowed = set(DATA_COMMON_KEYS) | set(DATA_KEYS_BY_SOURCE[kind])
    raw = ctx.value_at(path)
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

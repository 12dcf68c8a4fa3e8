"""Building a recipe's input pipelines, one shard per rank.

Every source produces unbatched `(features, label)` examples. Then, in this
order: the validation split (deterministic, by example index, before
sharding, so every rank agrees on which examples are held out), sharding by
rank (rank r keeps examples r, r + size, ...), optional caching, shuffling,
batching at the per-rank batch size (`drop_remainder=True` for training) and
repeating. The number of steps per epoch is agreed between ranks by the
caller (the smallest shard decides), so every rank runs the same number of
steps and the gradient collectives line up.

The bundled digits (`hvdkeras/data/digits.csv.gz`) are the 1,797 8x8 images of
the UCI handwritten digits test set, pixels 0..16 scaled to [0, 1].

What may import this module: the recipes' training code (it imports
TensorFlow).
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from hvdkeras.inputs.tf_data import shard_dataset
from hvdkeras.recipes.data_files import (DataError, compression_for, csv_columns,
                                         expand_paths, load_digits, read_first_line,
                                         validation_mask)
from hvdkeras.recipes.schema_data import TF_IO_MESSAGE, data_source_kind
from hvdkeras.recipes.user_code import accepted_parameters, import_function


@dataclasses.dataclass
class Data:
    """A rank's input pipelines.

    Attributes:
        train: Batched, repeated forever (fit needs steps_per_epoch).
        validation: Batched, one pass; None without validation data.
        train_examples: Examples in this rank's training shard (None if the
            source is endless).
        validation_examples: Examples in this rank's validation shard, or None.
        input_shape: The shape of one example's features (None for dicts).
        num_classes: From the recipe (None if unknown).
    """

    train: Any
    validation: Any
    train_examples: Optional[int]
    validation_examples: Optional[int]
    input_shape: Optional[List[int]]
    num_classes: Optional[int]


# --------------------------------------------------------------------------
# Sources: each returns (train examples, validation examples or None, counts)
# --------------------------------------------------------------------------


def _label_cast(label, num_classes: Optional[int]):
    return tf.cast(label, tf.int32 if num_classes else tf.float32)


def _features(x, data: dict):
    """Scale and reshape one example's feature vector."""
    x = tf.cast(x, tf.float32)
    if data["scale"] is not None:
        x = x * data["scale"]
    if data["input_shape"]:
        x = tf.reshape(x, data["input_shape"])
    return x


def _split(dataset, fraction: Optional[float], keep_validation: bool):
    """The training (or validation) part of `dataset` by `validation_mask`."""
    if not fraction:
        return dataset
    f = tf.constant(fraction, tf.float64)

    def held_out(i):
        i = tf.cast(i, tf.float64)
        return tf.math.floor((i + 1) * f) > tf.math.floor(i * f)

    pairs = dataset.enumerate()
    if keep_validation:
        pairs = pairs.filter(lambda i, e: held_out(i))
    else:
        pairs = pairs.filter(lambda i, e: tf.logical_not(held_out(i)))
    return pairs.map(lambda i, e: e)


def _tfrecord_examples(data: dict, files: List[str]):
    spec = {}
    for name, feature in data["features"].items():
        dtype = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}[feature["dtype"]]
        spec[name] = tf.io.FixedLenFeature(feature["shape"], dtype)
    label = data["label"]
    inputs = [name for name in data["features"] if name != label]

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        if len(inputs) == 1:
            x = _features(example[inputs[0]], data)
        else:
            x = {name: example[name] for name in inputs}
        return x, _label_cast(example[label], data["num_classes"])

    compression = compression_for(data["compression"], files)
    return tf.data.TFRecordDataset(files, compression_type=compression).map(
        parse, num_parallel_calls=tf.data.AUTOTUNE)


def _csv_examples(data: dict, files: List[str]):
    compression = compression_for(data["compression"], files)
    count, features, label, _ = csv_columns(data, read_first_line(files[0], compression))
    selected = sorted(set(features) | {label})
    position = {column: k for k, column in enumerate(selected)}
    dataset = tf.data.experimental.CsvDataset(
        files, record_defaults=[tf.float32] * len(selected), header=bool(data["header"]),
        compression_type=compression, select_cols=selected)

    def to_pair(*row):
        x = tf.stack([row[position[c]] for c in features])
        return _features(x, data), _label_cast(row[position[label]], data["num_classes"])

    return dataset.map(to_pair, num_parallel_calls=tf.data.AUTOTUNE)


def import_tensorflow_io():
    """tensorflow_io, or DataError with the exact versions it runs on."""
    try:
        import tensorflow_io as tfio  # lazy: an optional extra (hvdkeras[io])
    except Exception as error:  # ImportError, or an undefined symbol on load
        raise DataError(f"{TF_IO_MESSAGE}; importing it failed: {error}") from None
    return tfio


def _parquet_examples(data: dict, files: List[str]):
    tfio = import_tensorflow_io()
    label = data["label"]
    try:
        if data["columns"]:
            features = list(data["columns"])
        else:
            spec = tfio.IODataset.from_parquet(files[0]).element_spec
            names = [k.decode() if isinstance(k, bytes) else k for k in spec]
            if label not in names:
                raise DataError(f"no column named {label!r} in {files[0]}; it has: "
                                f"{', '.join(names)}", "label")
            features = [n for n in names if n != label]
        columns = features + [label]
        parts = [tfio.IODataset.from_parquet(f, columns=columns) for f in files]
    except DataError:
        raise
    except Exception as error:  # ops that fail to load or run on this TensorFlow
        raise DataError(f"{TF_IO_MESSAGE}; reading {files[0]} failed: {error}") from None
    dataset = parts[0]
    for part in parts[1:]:
        dataset = dataset.concatenate(part)

    def to_pair(row):
        row = {(k.decode() if isinstance(k, bytes) else k): v for k, v in row.items()}
        x = tf.stack([tf.cast(row[c], tf.float32) for c in features])
        return _features(x, data), _label_cast(row[label], data["num_classes"])

    return dataset.map(to_pair)


def _file_examples(data: dict, patterns: Sequence[str]):
    files = expand_paths(patterns)
    if not files:
        raise DataError(f"no files match {', '.join(patterns)}")
    reader = {"tfrecord": _tfrecord_examples, "csv": _csv_examples,
              "parquet": _parquet_examples}[data["source"]]
    return reader(data, files)


def _function_examples(data: dict, rank: int, size: int):
    function = import_function(data["source"])
    args = dict(data["args"] or {})
    accepted = accepted_parameters(function)
    for key, value in (("rank", rank), ("size", size), ("seed", data["seed"])):
        if key not in args and accepted is not None and key in accepted:
            args[key] = value
    dataset = function(**args)
    if not isinstance(dataset, tf.data.Dataset):
        raise DataError(f"data.source {data['source']!r} returned {type(dataset).__name__}, "
                        "not a tf.data.Dataset")
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2):
        raise DataError(f"data.source {data['source']!r} must yield unbatched (features, label) "
                        f"pairs; its elements are {spec}")
    return dataset


def _count(dataset) -> int:
    cardinality = int(dataset.cardinality())
    if cardinality >= 0:
        return cardinality
    return int(dataset.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def _finish(train, validation, data: dict, rank: int, size: int,
            train_examples: Optional[int] = None, validation_examples: Optional[int] = None,
            already_sharded: bool = False) -> Tuple[Any, Any, Optional[int], Optional[int]]:
    # Shard, then cache, then shuffle (Note [shard before shuffling]); the
    # caller agrees on the steps per epoch, so the shards may differ by one.
    shards = size if data["shard"] and not already_sharded else 1
    sharding = dict(rank=rank if shards > 1 else 0, size=shards, equal_shards=False,
                    cache=data["cache"])
    train = shard_dataset(train, shuffle_buffer=data["shuffle_buffer"] if data["shuffle"]
                          else None, seed=data["seed"], **sharding)
    if validation is not None:
        validation = shard_dataset(validation, **sharding)
    if train_examples is None:
        train_examples = _count(train)
    if validation is not None:
        if validation_examples is None:
            validation_examples = _count(validation)
        # A known length lets Keras run exactly one pass without a warning.
        validation = validation.apply(tf.data.experimental.assert_cardinality(validation_examples))
    batch = data["batch_size"]
    train = train.batch(batch, drop_remainder=True).repeat().prefetch(tf.data.AUTOTUNE)
    if validation is not None:
        validation = validation.batch(batch).prefetch(tf.data.AUTOTUNE)
    return train, validation, train_examples, validation_examples


def _bundled(data: dict, rank: int, size: int):
    x, y = load_digits()
    x = x / 16.0
    x = x.reshape((-1, *data["input_shape"])).astype(np.float32)
    fraction = (data["validation"] or {}).get("split")
    held_out = validation_mask(len(y), fraction) if fraction else np.zeros(len(y), bool)
    shard = slice(rank, None, size) if data["shard"] else slice(None)
    x_train, y_train = x[~held_out][shard], y[~held_out][shard]
    train = tf.data.Dataset.from_tensor_slices((x_train, y_train))
    validation, validation_count = None, None
    if fraction:
        x_val, y_val = x[held_out][shard], y[held_out][shard]
        validation = tf.data.Dataset.from_tensor_slices((x_val, y_val))
        validation_count = len(y_val)
    return _finish(train, validation, data, rank, size, len(y_train), validation_count,
                   already_sharded=True)


def _synthetic(data: dict, rank: int, size: int):
    batch = data["batch_size"]
    rng = np.random.default_rng((data["seed"] or 0) + rank)
    shape = tuple(data["input_shape"])
    x = rng.random((batch, *shape), dtype=np.float32)
    y = rng.integers(0, data["num_classes"], size=batch).astype(np.int32)
    one_batch = tf.data.Dataset.from_tensors((x, y))
    train = one_batch.repeat().prefetch(1)
    validation, validation_count = None, None
    fraction = (data["validation"] or {}).get("split")
    if fraction:
        batches = max(1, int(data["samples"] * fraction) // batch)
        validation = one_batch.repeat(batches)
        validation_count = batches * batch
    return train, validation, data["samples"], validation_count


def build_data(recipe: dict, rank: int, size: int) -> Data:
    """This rank's training and validation pipelines for the recipe.

    Raises:
        DataError: files missing, columns not found, tensorflow-io unusable, ...
    """
    data = dict(recipe["data"])
    kind = data_source_kind(data["source"])
    fraction = (data["validation"] or {}).get("split")
    if kind == "bundled":
        train, validation, n_train, n_val = _bundled(data, rank, size)
    elif kind == "synthetic":
        train, validation, n_train, n_val = _synthetic(data, rank, size)
    else:
        if kind == "function":
            examples = _function_examples(data, rank, size)
        else:
            examples = _file_examples(data, data["path"])
        validation = None
        if fraction:
            validation = _split(examples, fraction, keep_validation=True)
            examples = _split(examples, fraction, keep_validation=False)
        elif data["validation"] is not None and data["validation"]["path"]:
            validation = _file_examples(data, data["validation"]["path"])
        train, validation, n_train, n_val = _finish(examples, validation, data, rank, size)
    spec = train.element_spec[0]
    input_shape = [int(d) for d in spec.shape[1:]] if hasattr(spec, "shape") else None
    return Data(train=train, validation=validation, train_examples=n_train,
                validation_examples=n_val, input_shape=input_shape,
                num_classes=data.get("num_classes"))


def export_digits(path: str, fmt: str) -> int:
    """Writes the bundled digits as TFRecord ('tfrecord') or CSV with a header ('csv').

    TFRecord examples hold `pixels` (64 floats, 0..16) and `label` (int64).
    Returns the number of examples written. (Parquet needs pyarrow:
    `hvdkeras/data/digits.parquet` ships ready-made.)
    """
    x, y = load_digits()
    if fmt == "csv":
        with open(path, "w") as f:
            f.write(",".join([f"p{i}" for i in range(64)] + ["label"]) + "\n")
            for row, label in zip(x, y):
                f.write(",".join(f"{v:g}" for v in row) + f",{int(label)}\n")
        return len(y)
    if fmt == "tfrecord":
        with tf.io.TFRecordWriter(path) as writer:
            for row, label in zip(x, y):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "pixels": tf.train.Feature(float_list=tf.train.FloatList(value=row.tolist())),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)])),
                }))
                writer.write(example.SerializeToString())
        return len(y)
    raise ValueError(f"unknown format {fmt!r}; use 'tfrecord' or 'csv'")

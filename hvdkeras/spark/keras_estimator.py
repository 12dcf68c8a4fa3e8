"""Horovod's Spark `KerasEstimator`: fit a Keras model on a Spark DataFrame.

`fit(df)` copies the feature and label columns to Parquet in the `Store`,
trains on `num_proc` Spark tasks (one hvdkeras rank each, through
`hvdkeras.spark.run`) and returns a `KerasModel`, a Spark ML Transformer
that adds the model's predictions to a DataFrame.

Each rank reads the Parquet copy with pyarrow and keeps its equal share of
the rows in memory (Horovod streams through Petastorm instead): the data must
fit in a task's memory.

What may import this module: `hvdkeras.spark.keras` (lazily from the
facade). It needs pyspark, pyarrow and Keras.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, List, Optional, Sequence

import cloudpickle
import keras
import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf
from pyspark.ml import Estimator
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT

from hvdkeras.callbacks import BroadcastGlobalVariablesCallback, MetricAverageCallback
from hvdkeras.engine import world
from hvdkeras.spark.keras_data import model_arrays, rank_rows, steps_per_epoch
from hvdkeras.spark.keras_model import KerasModel
from hvdkeras.spark.runner import run as spark_run
from hvdkeras.spark.store import Store
from hvdkeras.training.checkpoint_writing import save_model_atomic
from hvdkeras.training.optimizer import DistributedOptimizer


class SparkBackend:
    """Horovod's Spark backend: how many tasks train, and where their output goes.

    Args:
        num_proc: Number of ranks (Spark tasks); default: the context's
            `defaultParallelism`.
        env: Extra environment variables for the ranks.
        **kwargs: Horovod's other options (`stdout`, `stderr`, `verbose`,
            `prefix_output_with_timestamp`, ...), accepted for its scripts:
            hvdkeras's ranks write to their Spark task's output.

    Example:

    ```python
    backend = SparkBackend(num_proc=4)
    ```
    """

    def __init__(self, num_proc: Optional[int] = None, env: Optional[dict] = None,
                 **kwargs: Any) -> None:
        self._num_proc = num_proc
        self.env = dict(env or {})
        self.options = kwargs

    def num_processes(self) -> Optional[int]:
        return self._num_proc


@dataclasses.dataclass
class _TrainingSpec:
    """What every rank needs to train (cloudpickled into the Spark job)."""

    model_path: str
    optimizer_config: dict
    loss: Any
    metrics: Any
    feature_cols: List[str]
    label_cols: List[str]
    batch_size: int
    epochs: int
    train_path: str
    val_path: Optional[str]
    callbacks: list
    verbose: int
    shuffle: bool
    random_seed: Optional[int]
    checkpoint_path: str


def _train_on_rank(spec: _TrainingSpec) -> dict:
    """One rank's training; rank 0 writes the trained model. Returns the history."""
    rank, size = world.rank(), world.size()
    if spec.random_seed is not None:
        keras.utils.set_random_seed(spec.random_seed)
    model = keras.models.load_model(spec.model_path, compile=False)
    input_shapes = [tuple(t.shape[1:]) for t in model.inputs]
    output_shapes = [tuple(t.shape[1:]) for t in model.outputs]

    def arrays(path: str, whole: bool):
        table = pq.read_table(path, columns=spec.feature_cols + spec.label_cols)
        columns = [table.column(c).to_pylist() for c in spec.feature_cols + spec.label_cols]
        if not whole:
            keep = rank_rows(table.num_rows, rank, size, spec.batch_size)
            columns = [[c[i] for i in keep] for c in columns]
        x = model_arrays(columns[:len(spec.feature_cols)], input_shapes)
        y = model_arrays(columns[len(spec.feature_cols):], output_shapes, labels=True)
        return (x[0] if len(x) == 1 else x), (y[0] if len(y) == 1 else y), table.num_rows

    x, y, total_rows = arrays(spec.train_path, whole=False)
    steps = steps_per_epoch(total_rows, size, spec.batch_size)
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if spec.shuffle:
        data = data.shuffle(len(np.atleast_1d(y if not isinstance(y, list) else y[0])),
                            seed=spec.random_seed, reshuffle_each_iteration=True)
    data = data.repeat().batch(spec.batch_size)
    validation = None
    if spec.val_path:
        vx, vy, _ = arrays(spec.val_path, whole=True)  # every rank scores all of it
        validation = (vx, vy)
    optimizer = DistributedOptimizer(keras.optimizers.deserialize(spec.optimizer_config))
    model.compile(optimizer=optimizer, loss=spec.loss, metrics=spec.metrics)
    callbacks = [BroadcastGlobalVariablesCallback(0), MetricAverageCallback(), *spec.callbacks]
    history = model.fit(data, steps_per_epoch=steps, epochs=spec.epochs, callbacks=callbacks,
                        validation_data=validation, verbose=spec.verbose if rank == 0 else 0)
    if rank == 0:
        save_model_atomic(model, spec.checkpoint_path)
    return {k: [float(v) for v in vals] for k, vals in history.history.items()}


def _plain_columns(df, columns: Sequence[str]):
    """The columns, Spark ML vectors turned into arrays (Parquet and pyarrow read those)."""
    selected = []
    for name in columns:
        if isinstance(df.schema[name].dataType, VectorUDT):
            selected.append(vector_to_array(df[name]).alias(name))
        else:
            selected.append(df[name])
    return df.select(*selected)


class KerasEstimator(Estimator):
    """Trains a Keras model on a Spark DataFrame with hvdkeras (Horovod's `KerasEstimator`).

    Args:
        model: A built Keras model (its input and output shapes decide how
            each column's values are reshaped).
        optimizer: A Keras optimizer (made distributed on each rank).
        loss: A Keras loss (name, function or object).
        metrics: Keras metrics, as for `compile`.
        feature_cols: One column per model input (numbers, arrays or Spark
            ML vectors).
        label_cols: One column per model output.
        batch_size: Per-rank batch size.
        epochs: Number of epochs.
        store: A `Store` for the Parquet copy and the trained model.
        num_proc: Number of ranks (default: the backend's, else Spark's
            `defaultParallelism`).
        backend: A `SparkBackend` (Horovod's way to give `num_proc`).
        validation: A fraction of the rows (0 < v < 1) held out for
            validation, or None.
        callbacks: Keras callbacks for every rank (picklable).
        verbose: Keras's `fit` verbosity on rank 0.
        shuffle: Shuffle each rank's rows every epoch.
        random_seed: Seed for the split, the shuffles and Keras.
        **kwargs: Horovod's other options (`inmemory_cache_all`,
            `shuffle_buffer_size`, ...), accepted for its scripts and unused:
            each rank holds its rows in memory.

    Example:

    ```python
    estimator = KerasEstimator(model=model, optimizer=keras.optimizers.Adam(1e-3),
                               loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                               feature_cols=["features"], label_cols=["label"],
                               batch_size=32, epochs=5, store=Store.create("/tmp/runs"),
                               num_proc=2)
    predictions = estimator.fit(train_df).transform(test_df)
    ```
    """

    def __init__(self, model: Any = None, optimizer: Any = None, loss: Any = None,
                 metrics: Any = None, feature_cols: Sequence[str] = (),
                 label_cols: Sequence[str] = (), batch_size: int = 32, epochs: int = 1,
                 store: Optional[Store] = None, num_proc: Optional[int] = None,
                 backend: Optional[SparkBackend] = None, validation: Optional[float] = None,
                 callbacks: Optional[list] = None, verbose: int = 1, shuffle: bool = True,
                 random_seed: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__()
        if not isinstance(model, keras.Model):
            raise ValueError(f"KerasEstimator needs a Keras 3 model, got {type(model).__name__}.")
        if optimizer is None or loss is None:
            raise ValueError("KerasEstimator needs optimizer= and loss=.")
        if not feature_cols or not label_cols:
            raise ValueError("KerasEstimator needs feature_cols= and label_cols=.")
        if not isinstance(store, Store):
            raise ValueError("KerasEstimator needs store=Store.create(path).")
        if validation is not None and not (isinstance(validation, float) and 0 < validation < 1):
            raise ValueError(f"validation must be a fraction between 0 and 1, got {validation!r}.")
        for name, value in (("batch_size", batch_size), ("epochs", epochs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {value!r}.")
        self.model, self.optimizer, self.loss, self.metrics = model, optimizer, loss, metrics
        self.feature_cols, self.label_cols = list(feature_cols), list(label_cols)
        self.batch_size, self.epochs, self.store = batch_size, epochs, store
        self.num_proc = num_proc if num_proc is not None else (
            backend.num_processes() if backend is not None else None)
        self.env = backend.env if backend is not None else {}
        self.validation, self.callbacks = validation, list(callbacks or [])
        self.verbose, self.shuffle, self.random_seed = verbose, shuffle, random_seed
        self.history: Optional[dict] = None

    def _fit(self, dataset):
        missing = [c for c in self.feature_cols + self.label_cols if c not in dataset.columns]
        if missing:
            raise ValueError(f"The DataFrame has no column(s) {missing}; it has "
                             f"{dataset.columns}.")
        store = self.store
        run_id = store.new_run_id()
        os.makedirs(store.get_run_path(run_id), exist_ok=True)
        plain = _plain_columns(dataset, self.feature_cols + self.label_cols)
        val_path = None
        if self.validation:
            train, val = plain.randomSplit([1 - self.validation, self.validation],
                                           seed=self.random_seed)
            val_path = store.get_val_data_path(run_id)
            val.write.mode("overwrite").parquet(val_path)
        else:
            train = plain
        train.write.mode("overwrite").parquet(store.get_train_data_path(run_id))
        model_path = os.path.join(store.get_run_path(run_id), "initial.keras")
        self.model.save(model_path)
        spec = _TrainingSpec(
            model_path=model_path,
            optimizer_config=keras.optimizers.serialize(self.optimizer), loss=self.loss,
            metrics=self.metrics, feature_cols=self.feature_cols, label_cols=self.label_cols,
            batch_size=self.batch_size, epochs=self.epochs,
            train_path=store.get_train_data_path(run_id), val_path=val_path,
            callbacks=self.callbacks, verbose=self.verbose, shuffle=self.shuffle,
            random_seed=self.random_seed, checkpoint_path=store.get_checkpoint_path(run_id))
        cloudpickle.dumps(spec)  # fails here, on the driver, for an unpicklable callback
        histories = spark_run(_train_on_rank, args=(spec,), num_proc=self.num_proc,
                              env=self.env)
        self.history = histories[0]
        return KerasModel(model_path=store.get_checkpoint_path(run_id),
                          feature_cols=self.feature_cols, label_cols=self.label_cols,
                          history=self.history, run_id=run_id)

"""`KerasModel`: the Spark ML Transformer a `KerasEstimator` returns.

What may import this module: `hvdkeras.spark.keras_estimator` and
`hvdkeras.spark.keras`. It needs pyspark, pandas and pyarrow.
"""

from __future__ import annotations

import os
import tempfile
from typing import Iterator, List, Optional, Sequence

import keras
import numpy as np
from pyspark.ml import Transformer
from pyspark.ml.functions import vector_to_array
from pyspark.ml.linalg import VectorUDT
from pyspark.sql.functions import monotonically_increasing_id
from pyspark.sql.types import ArrayType, DoubleType, LongType, StructField, StructType

from hvdkeras.spark.keras_data import model_arrays

_INPUT_PREFIX = "__hvdkeras_input_"


class KerasModel(Transformer):
    """A trained Keras model that adds its predictions to a DataFrame.

    Args:
        model_path: The trained `.keras` file (in the estimator's store).
        feature_cols: The columns fed to the model's inputs.
        label_cols: The label columns (they name the default output columns).
        output_cols: Names of the prediction columns; default
            `<label>__output` for each label column, as in Horovod.
        history: The training history (rank 0's, averaged over ranks).
        run_id: The store's run this model came from.

    Example:

    ```python
    predictions = keras_model.setOutputCols(["label_prob"]).transform(test_df)
    ```
    """

    def __init__(self, model_path: str, feature_cols: Sequence[str], label_cols: Sequence[str],
                 output_cols: Optional[Sequence[str]] = None, history: Optional[dict] = None,
                 run_id: Optional[str] = None) -> None:
        super().__init__()
        self.model_path = model_path
        self.feature_cols = list(feature_cols)
        self.label_cols = list(label_cols)
        self.output_cols = list(output_cols or [f"{c}__output" for c in label_cols])
        self.history = history
        self.run_id = run_id

    def setOutputCols(self, output_cols: Sequence[str]) -> "KerasModel":
        """Names the prediction columns (one per model output); returns self."""
        if len(output_cols) != len(self.label_cols):
            raise ValueError(f"{len(output_cols)} output column(s) for a model with "
                             f"{len(self.label_cols)} output(s).")
        self.output_cols = list(output_cols)
        return self

    def getOutputCols(self) -> List[str]:
        return list(self.output_cols)

    def getModel(self) -> keras.Model:
        """The trained Keras model, loaded on the driver."""
        return keras.models.load_model(self.model_path)

    def getHistory(self) -> Optional[dict]:
        return self.history

    def _transform(self, dataset):
        inputs = []
        for i, name in enumerate(self.feature_cols):
            column = dataset[name]
            if isinstance(dataset.schema[name].dataType, VectorUDT):
                column = vector_to_array(column)
            inputs.append(column.alias(f"{_INPUT_PREFIX}{i}"))
        staged = dataset.select("*", *inputs)
        kept = [f for f in staged.schema.fields if not isinstance(f.dataType, VectorUDT)]
        vectors = [f.name for f in staged.schema.fields if isinstance(f.dataType, VectorUDT)]
        with open(self.model_path, "rb") as f:
            model_bytes = staged.sparkSession.sparkContext.broadcast(f.read())
        feature_count = len(self.feature_cols)
        outputs = list(self.output_cols)
        out_schema = StructType(kept + [StructField(c, ArrayType(DoubleType())) for c in outputs])

        def predict(batches: Iterator):
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "model.keras")
                with open(path, "wb") as f:
                    f.write(model_bytes.value)
                model = keras.models.load_model(path, compile=False)
            shapes = [tuple(t.shape[1:]) for t in model.inputs]
            for frame in batches:
                x = model_arrays([frame[f"{_INPUT_PREFIX}{i}"] for i in range(feature_count)],
                                 shapes)
                predicted = model.predict(x[0] if len(x) == 1 else x, verbose=0)
                predicted = predicted if isinstance(predicted, list) else [predicted]
                for name, values in zip(outputs, predicted):
                    frame[name] = list(np.asarray(values, np.float64).reshape(len(frame), -1))
                yield frame

        # Vector columns cannot travel through Arrow: they are set aside and
        # joined back by a row id.
        with_id = staged.withColumn("__hvdkeras_row", monotonically_increasing_id())
        result = with_id.drop(*vectors).mapInPandas(
            predict, StructType(out_schema.fields + [StructField("__hvdkeras_row", LongType())]))
        if vectors:
            result = result.join(with_id.select("__hvdkeras_row", *vectors), "__hvdkeras_row")
        names = [c for c in dataset.columns] + outputs
        return result.select(*names)


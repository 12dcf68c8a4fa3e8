"""`hvdkeras.spark.keras`: Horovod's Spark Keras estimator under its module path.

* `KerasEstimator` (`keras_estimator`): fit a Keras model on a DataFrame.
* `KerasModel` (`keras_model`): the Transformer it returns.
* `SparkBackend`, `Store`: Horovod's names for where it runs and stores.

What may import it: user code. It needs pyspark, pyarrow, pandas and Keras.
"""

from hvdkeras.spark.keras_estimator import KerasEstimator, SparkBackend
from hvdkeras.spark.keras_model import KerasModel
from hvdkeras.spark.store import LocalStore, Store

__all__ = ["KerasEstimator", "KerasModel", "LocalStore", "SparkBackend", "Store"]

"""The variables through which a Spark task configures the rank it starts
(`hvdkeras.spark.runner` sets them, `hvdkeras.spark.task_rank` reads them).

What may import this module: the rest of `hvdkeras.spark` (no imports).
"""

ADDRESS_ENV = "HVDKERAS_SPARK_SERVICE"  # host:port of the driver's service
SECRET_ENV = "HVDKERAS_SPARK_SECRET"  # hex
INDEX_ENV = "HVDKERAS_SPARK_INDEX"
SIZE_ENV = "HVDKERAS_SPARK_SIZE"
START_TIMEOUT_ENV = "HVDKERAS_SPARK_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 300.0

"""Apache Spark integration: `run(fn, ...)` on barrier-mode Spark tasks, one rank per task.

Needs the ``[spark]`` extra (pyspark). See `hvdkeras.spark.runner` for how
the tasks form one MPI world.
"""

from hvdkeras.spark.runner import run

__all__ = ["run"]

"""Apache Spark integration: `run(fn, ...)` on barrier-mode Spark tasks, one rank per task.

Needs the ``[spark]`` extra (pyspark), imported only when `run` is called.
`runner` (the driver and the Spark tasks), `task_rank` (each rank's entry
point), `task_env` (what a task hands its rank) and `connect` (joining the
ranks into one MPI world). See `hvdkeras.spark.runner` for how.

What may import it: user code (`import hvdkeras.spark`). It imports
`hvdkeras.runner` and `hvdkeras.engine`.
"""

from hvdkeras.spark.runner import run

__all__ = ["run"]

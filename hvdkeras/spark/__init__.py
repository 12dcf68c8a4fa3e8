"""Apache Spark integration: `run(fn, ...)` on barrier-mode Spark tasks, one rank per task.

Needs the ``[spark]`` extra (pyspark), imported only when `run` is called.
`runner` holds what is Spark's own (the barrier stage, cancelling it); how
the ranks start and join is `hvdkeras.cluster`'s, shared with Ray.

What may import it: user code (`import hvdkeras.spark`). It imports
`hvdkeras.cluster`, `hvdkeras.runner` and `hvdkeras.engine`.
"""

from hvdkeras.spark.runner import run

__all__ = ["run"]

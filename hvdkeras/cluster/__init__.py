"""Ranks started by a cluster engine's tasks, one rank per task: the machinery
`hvdkeras.spark.run` and `hvdkeras.ray.run` share.

`job` (the driver's service state, each task's supervision of its rank, the
results), `task_rank` (each rank's entry point), `task_env` (what a task hands
its rank) and `connect` (joining the ranks into one MPI world). See
`hvdkeras.cluster.job` for how.

What may import it: the engine front ends (`hvdkeras.spark`, `hvdkeras.ray`).
It imports `hvdkeras.runner` and `hvdkeras.engine`.
"""

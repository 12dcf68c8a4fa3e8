"""Starting jobs: a command or a Python function on N ranks.

* `launch` (`launch(command, np, ...)`, what `hvdkerasrun` runs; also
  `hvdkeras.launch`): a command on N ranks through the mpiexec of the MPI
  that mpi4py loads, with `attempt` (one supervised run), `failures` (which
  rank failed first), `restart` (relaunching), `hosts`, `knobs` (flags to
  `HVDKERAS_*` variables), `mpi_env` (finding the right mpiexec) and `cli`
  (the `hvdkerasrun` command line).
* `rank_shim`: the wrapper every rank runs (by path, standard library only).
* `function_runner` (`run(fn, args, kwargs, np=2)`): a Python function on N
  fresh processes, with `run_task` and `task_files` on the ranks' side;
  results come back to the caller. HorovodRunner's `Runner(np)`, which may
  use Spark, lives in `hvdkeras.spark.horovod_runner`.
* `service`: the authenticated socket service the Spark runner uses.

What may import it: `hvdkeras.spark`, the recipes' launching code, the CLI and
the top-level package. It imports only `hvdkeras.engine.config` of hvdkeras,
and neither TensorFlow nor mpi4py: `hvdkerasrun` starts at once.
"""

from hvdkeras.runner.function_runner import RankFailedError, run
from hvdkeras.runner.launch import launch_job
from hvdkeras.runner.mpi_env import LauncherError
from hvdkeras.runner.restart import JobResult

__all__ = ["JobResult", "LauncherError", "RankFailedError", "launch_job", "run"]

"""Starting jobs: `launch` (what `hvdkerasrun` runs) and the function runner.

* ``hvdkeras.runner.launch.launch(command, np, ...)`` (also ``hvdkeras.launch``):
  a command on N ranks via the right mpiexec. The name ``launch`` here stays
  the module, so ``import hvdkeras.runner.launch`` keeps working.
* `run(fn, args, kwargs, np=2)` / `Runner(np).run(fn, **kwargs)`: a Python
  function on N fresh processes; results come back to the caller.
"""

from hvdkeras.runner.function_runner import RankFailedError, Runner, run
from hvdkeras.runner.launch import JobResult, launch_job
from hvdkeras.runner.mpi_env import LauncherError

__all__ = ["JobResult", "LauncherError", "RankFailedError", "Runner", "launch_job", "run"]

"""Starting the ranks of a recipe run.

`launch_ranks` uses `hvdkeras.runner.launch.launch` (the project's launcher)
when it is installed, and otherwise `_launch_with_mpiexec`: the `mpiexec`
next to this Python (the `mpich` wheel's). `launcher_in_use()` says which.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def _project_launcher():
    """`hvdkeras.runner.launch.launch`, or None while that module does not exist."""
    try:
        from hvdkeras.runner.launch import launch
    except ModuleNotFoundError as error:
        if error.name in ("hvdkeras.runner", "hvdkeras.runner.launch"):
            return None
        raise
    return launch


def launcher_in_use() -> str:
    """'hvdkeras.runner.launch' or 'mpiexec (fallback)'."""
    return "hvdkeras.runner.launch" if _project_launcher() is not None else "mpiexec (fallback)"


def rank_command(recipe: str, overrides: Sequence[str] = (),
                 summary_json: Optional[str] = None) -> List[str]:
    """The command every rank runs."""
    command = [sys.executable, "-m", "hvdkeras.recipes.run", recipe]
    for override in overrides:
        command += ["--set", override]
    if summary_json:
        command += ["--summary-json", summary_json]
    return command


def mpiexec_path() -> Path:
    """The mpiexec next to the running interpreter (not resolved: venv symlinks)."""
    return Path(sys.executable).parent / "mpiexec"


def _launch_with_mpiexec(command: List[str], np: int, hosts: Optional[str] = None,
                         hostfile: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                         max_restarts: int = 0) -> int:
    """Fallback until hvdkeras.runner exists: `<venv>/bin/mpiexec -n N command`."""
    mpiexec = mpiexec_path()
    if not mpiexec.exists():
        print(f"hvdkeras: error: {mpiexec} not found; install the 'mpich' wheel in this "
              "environment (pip install mpich)", file=sys.stderr)
        return 2
    if max_restarts:
        print("hvdkeras: note: --max-restarts needs hvdkeras.runner; running once.",
              file=sys.stderr)
    full = [str(mpiexec), "-n", str(np)]
    if hosts:
        full += ["-hosts", hosts]
    if hostfile:
        full += ["-f", hostfile]
    child_env = dict(os.environ)
    child_env.update(env or {})
    child_env.setdefault("HVDKERAS_EXPECTED_SIZE", str(np))
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.call(full + command, env=child_env)


def launch_ranks(command: List[str], np: int, hosts: Optional[str] = None,
                 hostfile: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                 max_restarts: int = 0) -> int:
    """Runs `command` on `np` ranks; returns the job's exit code."""
    launch = _project_launcher()
    if launch is None:
        return _launch_with_mpiexec(command, np, hosts=hosts, hostfile=hostfile, env=env,
                                    max_restarts=max_restarts)
    return launch(command, np=np, hosts=hosts, hostfile=hostfile, env=env,
                  max_restarts=max_restarts)

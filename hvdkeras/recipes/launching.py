"""Starting the ranks of a recipe run: the command each rank runs, the
engine variables from the recipe's `engine` section, and the launch itself
(through `hvdkeras.runner.launch`, the same launcher as `hvdkerasrun`).

What may import this module: the CLI. It imports neither TensorFlow nor
mpi4py.
"""

from __future__ import annotations

import sys
from typing import Dict, List, Optional, Sequence

from hvdkeras.engine import config
from hvdkeras.runner.launch import launch
from hvdkeras.runner.remote import RemoteAccess


def rank_command(recipe: str, overrides: Sequence[str] = (),
                 summary_json: Optional[str] = None) -> List[str]:
    """The command every rank runs."""
    command = [sys.executable, "-m", "hvdkeras.recipes.run", recipe]
    for override in overrides:
        command += ["--set", override]
    if summary_json:
        command += ["--summary-json", summary_json]
    return command


def engine_env(recipe: dict) -> Dict[str, str]:
    """The variables every rank gets: HVDKERAS_* for the recipe's engine section
    (set ones only) and KERAS_BACKEND for its `backend`."""
    engine = recipe["engine"]
    env: Dict[str, str] = {}
    if recipe.get("backend"):
        env["KERAS_BACKEND"] = recipe["backend"]
    if engine["fusion_threshold"] is not None:
        env[config.FUSION_THRESHOLD] = str(int(engine["fusion_threshold"]))
    if engine["cycle_time_ms"] is not None:
        env[config.CYCLE_TIME] = repr(float(engine["cycle_time_ms"]))
    if engine["timeline"] is not None:
        env[config.TIMELINE] = engine["timeline"]
    if engine["autotune"] is not None:
        env[config.AUTOTUNE] = "1" if engine["autotune"] else "0"
    return env


def launch_ranks(command: List[str], np: int, hosts: Optional[str] = None,
                 hostfile: Optional[str] = None, env: Optional[Dict[str, str]] = None,
                 max_restarts: int = 0, min_np: Optional[int] = None,
                 max_np: Optional[int] = None, remote: Optional[RemoteAccess] = None) -> int:
    """Runs `command` on `np` ranks (elastically with `min_np`/`max_np`;
    `remote`: how other hosts are reached); returns the exit code."""
    return launch(command, np=np, hosts=hosts, hostfile=hostfile, env=env,
                  max_restarts=max_restarts, min_np=min_np, max_np=max_np, remote=remote)

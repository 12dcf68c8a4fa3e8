"""`launch()`: run a command on N ranks through the right mpiexec; `hvdkerasrun`.

    hvdkerasrun -np 2 python train.py
    hvdkerasrun -np 4 -H a:2,b:2 --fusion-threshold-mb 32 --max-restarts 2 python train.py

What it adds on top of plain ``mpiexec``:

* the ``mpiexec`` of the MPI that mpi4py loads, checked (a launcher from
  another MPI aborts every rank or silently gives N worlds of size 1);
* engine knobs as flags (``--fusion-threshold-mb`` -> ``HVDKERAS_FUSION_THRESHOLD``, ...);
* ``[rank]<stdout>: `` prefixes and one log file per rank (``--output-dir``);
* fail fast: when a rank exits non-zero or dies, the others are ended and the
  launcher returns within 30 s, naming the rank, its exit code or signal and
  its last lines;
* ``--max-restarts K``: relaunch the whole job after a failure (with backoff);
  ``--min-np/--max-np`` (and ``--host-discovery-script``) relaunch it on the
  ranks that are available then (`elastic`).

Each rank runs ``python rank_shim.py ... -- COMMAND`` (see `rank_shim`); one
attempt is supervised in `attempt`, failures are named in `failures`, and
restarts follow `restart`. The command line is `hvdkeras.runner.cli`.

What may import this module: the function runner, `hvdkeras.spark`, the
recipes' launching code and the top-level package (standard library only).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

from hvdkeras.engine.config import EXPECTED_SIZE as EXPECTED_SIZE_ENV
from hvdkeras.engine.config import transport_defaults
from hvdkeras.runner import elastic as elastic_world
from hvdkeras.runner import mpi_env, startup_noise
from hvdkeras.runner import remote as remote_access
from hvdkeras.runner.hosts import (HostSlots, hydra_machinefile, openmpi_hostfile, parse_hostfile,
                                   parse_hosts, total_slots)
from hvdkeras.runner.restart import (ATTEMPT_ENV, ElasticState, JobResult, RestartPolicy,
                                     run_attempts)

BACKOFF_ENV = "HVDKERAS_RESTART_BACKOFF_SECONDS"


# ---------------------------------------------------------------------------
# argument checks
# ---------------------------------------------------------------------------


def _check_arguments(command, np, hosts, hostfile, env, max_restarts) -> Optional[list[HostSlots]]:
    if isinstance(command, (str, bytes)) or not command \
            or not all(isinstance(c, str) and c for c in command):
        raise ValueError("command must be a non-empty list of strings, e.g. ['python', 'train.py'].")
    if isinstance(np, bool) or not isinstance(np, int) or np < 1:
        raise ValueError(f"np must be a whole number >= 1, got {np!r}.")
    if hosts and hostfile:
        raise ValueError("give either hosts (-H) or hostfile (--hostfile), not both.")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}.")
    if env is not None:
        bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)
               or not k or "=" in k]
        if bad:
            raise ValueError(f"env must map variable names to strings; bad entries: {bad!r}.")
    host_list = parse_hosts(hosts) if hosts else parse_hostfile(hostfile) if hostfile else None
    if host_list is not None and np > total_slots(host_list):
        raise ValueError(f"np={np} is more than the {total_slots(host_list)} slots of the hosts "
                         f"given ({', '.join(f'{h.host}:{h.slots}' for h in host_list)}).")
    return host_list


_RUNTIME_PREFIXES = ("PMI_", "PMIX_", "OMPI_COMM_WORLD_", "HYDI_", "HYDRA_PROXY")
_RUNTIME_NAMES = {"MPI_LOCALNRANKS", "MPI_LOCALRANKID", "OMPI_UNIVERSE_SIZE", "OMPI_FILE_LOCATION",
                  "HVDKERAS_UNDER_MPI"}


def inherited_env(environ) -> dict[str, str]:
    """This process's environment minus what an MPI launcher set for *it*.

    A launcher started from inside a rank (the function runner called from an
    MPI job, say) must not hand its own rank's PMI connection, rank or world
    size on to the new job's ranks.
    """
    return {k: v for k, v in environ.items()
            if not k.startswith(_RUNTIME_PREFIXES) and k not in _RUNTIME_NAMES}


_probe_cache: dict = {}


def _rank_python(command: Sequence[str]) -> str:
    """The interpreter the ranks run (the command's, when it is a python), else ours."""
    first = os.path.basename(command[0])
    if re.match(r"^python[0-9.]*$", first):
        found = shutil.which(command[0])
        if found:
            return found
    return sys.executable


def resolve_mpiexec(command: Sequence[str]) -> tuple[str, str, mpi_env.MpiLibrary]:
    """(mpiexec path, vendor, library) for `command`; raises mpi_env.LauncherError."""
    python = _rank_python(command)
    key = (python, os.environ.get(mpi_env.MPIEXEC_ENV, ""), os.environ.get("PATH", ""))
    if key not in _probe_cache:
        library = mpi_env.probe_library(python)
        path, vendor = mpi_env.choose_mpiexec(
            library, mpi_env.candidate_mpiexecs(library.path, python))
        _probe_cache[key] = (path, vendor, library)
    return _probe_cache[key]


def launch(command: list[str], np: int, hosts: str | None = None, hostfile: str | None = None,
           env: dict[str, str] | None = None, output_dir: str | None = None,
           max_restarts: int = 0, prefix_output: bool = True, min_np: Optional[int] = None,
           max_np: Optional[int] = None, host_discovery_script: Optional[str] = None,
           remote: Optional[remote_access.RemoteAccess] = None) -> int:
    """Runs `command` on `np` ranks through the mpiexec of the MPI that mpi4py loads.

    Args:
        command: The program and its arguments, e.g. ``["python", "train.py"]``.
        np: Number of ranks.
        hosts: ``"host1:2,host2:2"`` (horovodrun's ``-H``); default: this machine.
        hostfile: A file of ``host slots=N`` lines (horovodrun's ``--hostfile``).
        env: Variables set for every rank, on top of this process's environment
            (e.g. `hvdkeras.runner.knobs.knob_env` output).
        output_dir: Also write each rank's output to ``output_dir/rank.<r>.log``
            and the launcher's messages to ``output_dir/launcher.log``.
        max_restarts: After a failure, relaunch the whole job up to this many
            times (backoff 1 s, 2 s, 4 s, ... up to 30 s). Each rank sees the
            attempt number in ``HVDKERAS_ATTEMPT`` (1-based).
        prefix_output: Prefix each line with ``[rank]<stdout>: `` / ``<stderr>: ``.
        min_np: Make the job elastic: after a failure it is relaunched on
            the ranks available then, at least `min_np` and at most `max_np`
            (default: `np` for both). Without a discovery script, the slots
            of ranks that failed are left out. `max_restarts` defaults to 3
            for elastic jobs.
        max_np: See `min_np`.
        host_discovery_script: An executable printing the available hosts,
            ``host:slots`` per line; run before the first attempt (when no
            hosts are given) and before every relaunch.
        remote: How other hosts are reached (`hvdkeras.runner.remote.RemoteAccess`:
            the ssh command, port and key, the network interfaces, the
            launcher's address); every host that is not this machine must
            answer before anything starts. Default: plain ``ssh``.

    Example:

    ```python
    code = hvdkeras.launch(["python", "train.py"], np=3, min_np=2)
    ```

    Returns:
        0 on success, else the failing rank's exit code (128 + N for signal
        N), or mpiexec's when no rank reported; 130 when interrupted.

    Raises:
        ValueError: bad arguments (empty command, np < 1, unreadable hostfile,
            more ranks than slots, ...).
        hvdkeras.runner.mpi_env.LauncherError: no mpiexec of the MPI that
            mpi4py loads.
    """
    return launch_job(command, np, hosts=hosts, hostfile=hostfile, env=env, output_dir=output_dir,
                      remote=remote,
                      max_restarts=max_restarts, prefix_output=prefix_output, min_np=min_np,
                      max_np=max_np, host_discovery_script=host_discovery_script).exit_code


def _elastic_start(np: int, host_list: Optional[list[HostSlots]], max_restarts: int,
                   min_np: Optional[int], max_np: Optional[int], script: Optional[str]):
    """(hosts, np, max_restarts, ElasticState or None) for the first attempt."""
    if min_np is None and max_np is None and not script:
        return host_list, np, max_restarts, None
    settings = elastic_world.Elastic(np if min_np is None else min_np,
                                     np if max_np is None else max_np, script)
    if not settings.min_np <= np <= settings.max_np:
        raise ValueError(f"-np {np} must lie between --min-np {settings.min_np} and --max-np "
                         f"{settings.max_np}.")
    if script and host_list is None:
        discovered = elastic_world.discover(script)
        host_list = elastic_world.fit_world(discovered, dataclasses.replace(settings, max_np=np))
        if host_list is None:
            raise ValueError(f"the host-discovery script reports {total_slots(discovered)} "
                             f"slot(s), fewer than --min-np {settings.min_np}.")
        np = total_slots(host_list)
    state = ElasticState(settings, list(host_list) if host_list is not None
                         else [HostSlots("localhost", np)], local=host_list is None)
    return host_list, np, max_restarts or elastic_world.DEFAULT_ELASTIC_RESTARTS, state


def launch_job(command: list[str], np: int, hosts: str | None = None, hostfile: str | None = None,
               env: dict[str, str] | None = None, output_dir: str | None = None,
               max_restarts: int = 0, prefix_output: bool = True,
               timeout: float | None = None, min_np: Optional[int] = None,
               max_np: Optional[int] = None,
               host_discovery_script: Optional[str] = None,
               remote: Optional[remote_access.RemoteAccess] = None) -> JobResult:
    """`launch` returning a `JobResult` (exit code, attempts, the failing rank's record).

    `timeout` (seconds, all attempts together) ends every rank and returns
    exit code 124 when the job runs longer.
    """
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}.")
    deadline = time.monotonic() + timeout if timeout is not None else None
    command = list(command) if isinstance(command, (list, tuple)) else command
    host_list = _check_arguments(command, np, hosts, hostfile, env, max_restarts)
    host_list, np, max_restarts, elastic = _elastic_start(np, host_list, max_restarts, min_np,
                                                          max_np, host_discovery_script)
    mpiexec, vendor, _library = resolve_mpiexec(command)
    backoff = float((env or {}).get(BACKOFF_ENV) or os.environ.get(BACKOFF_ENV) or 1)
    policy = RestartPolicy(max_restarts=max_restarts, backoff_s=backoff)

    log_file = None
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        log_file = os.path.join(os.path.abspath(output_dir), "launcher.log")
    job_dir = tempfile.mkdtemp(prefix="hvdkerasrun-")
    try:
        plan_hosts, plan_hostfile = None, None
        if host_list is not None and hostfile:
            plan_hostfile = os.path.join(job_dir, "hostfile")
            text = openmpi_hostfile(host_list) if vendor == mpi_env.OPENMPI else hydra_machinefile(host_list)
            Path(plan_hostfile).write_text(text, encoding="utf-8")
        elif host_list is not None:
            plan_hosts = host_list
        extra_env = dict(env or {})
        rank_env = inherited_env(os.environ)
        rank_env.update(extra_env)
        rank_env[EXPECTED_SIZE_ENV] = str(np)
        rank_env.setdefault("PYTHONUNBUFFERED", "1")
        rank_env.update(transport_defaults(rank_env))  # Note [eager ring segments]
        quiet = startup_noise.quiet_env(rank_env)  # Note [quiet start-up]
        rank_env.update(quiet)
        user_args = tuple(shlex.split(os.environ.get(mpi_env.MPIEXEC_ARGS_ENV, "")))
        access_args, access_env = _remote_access(remote or remote_access.RemoteAccess(),
                                                 host_list, vendor, user_args, job_dir,
                                                 discovery=bool(host_discovery_script))
        rank_env.update(access_env)
        plan = mpi_env.LaunchPlan(
            mpiexec=mpiexec, vendor=vendor, np=np, hosts=plan_hosts, hostfile=plan_hostfile,
            env_names=mpi_env.forwarded_env_names(
                [*extra_env, *quiet, *access_env, EXPECTED_SIZE_ENV, ATTEMPT_ENV], rank_env),
            as_root=hasattr(os, "geteuid") and os.geteuid() == 0,
            extra_args=access_args + user_args,
        )
        return run_attempts(command, plan, rank_env, policy, job_dir, output_dir, log_file,
                            prefix_output, deadline, elastic)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)


def _remote_access(access: remote_access.RemoteAccess, host_list: Optional[list[HostSlots]],
                   vendor: str, user_args: tuple, job_dir: str,
                   discovery: bool = False) -> tuple[tuple, dict]:
    """(mpiexec options, rank variables) for reaching the hosts; first checks
    that every host that is not this machine answers (as horovodrun does),
    unless the user's --mpi-args choose how processes start. With a
    host-discovery script (`discovery`), hosts met at a relaunch are reached
    with the same ssh command even when the first attempt had none.

    Raises:
        ValueError: naming the hosts that could not be reached.
    """
    far = []
    own_launcher = remote_access.picks_own_launcher(user_args) or access.through_slurm
    if host_list and not own_launcher:
        far = remote_access.remote_hosts([h.host for h in host_list],
                                         remote_access.this_machine_names())
    script = None
    if far:
        failures = remote_access.check_reachable(access, far)
        if failures:
            raise ValueError(remote_access.unreachable_message(failures, access))
    if vendor != mpi_env.OPENMPI and not own_launcher and (
            far or (discovery and not access.is_default())):
        script = remote_access.write_launcher_script(access, job_dir)
    args = remote_access.mpiexec_args(access, vendor, script,
                                      remote_hosts=bool(far) or (discovery and not own_launcher))
    return tuple(args), remote_access.rank_env(access)

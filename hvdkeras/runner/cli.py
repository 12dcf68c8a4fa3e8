"""`hvdkerasrun`: the command line of the launcher (see `hvdkeras.runner.launch`).

    hvdkerasrun -np 2 python train.py
    hvdkerasrun -np 4 -H a:2,b:2 --fusion-threshold-mb 32 --max-restarts 2 python train.py
    hvdkerasrun python train.py     # inside a Slurm allocation: its hosts and tasks

What may import this module: the `hvdkerasrun` console script. It imports
neither TensorFlow nor mpi4py: the launcher starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from typing import Sequence

from hvdkeras.runner import mpi_env, slurm
from hvdkeras.runner.remote import picks_own_launcher
from hvdkeras.runner.hosts import hosts_argument
from hvdkeras.runner.knobs import LOG_LEVELS, Knobs, knob_env
from hvdkeras.runner.launch import launch, resolve_mpiexec
from hvdkeras.runner.remote_options import add_remote_arguments, remote_access_from_args
from hvdkeras.runner.restart import log


def build_parser() -> argparse.ArgumentParser:
    # No abbreviations: an option of the command (`train.py --timeline x`)
    # must not be taken for a prefix of one of ours (--timeline-filename).
    p = argparse.ArgumentParser(
        prog="hvdkerasrun", allow_abbrev=False,
        usage="hvdkerasrun -np N [-H HOSTS | --hostfile FILE] [options] COMMAND [ARGS...]",
        description="Run COMMAND on N ranks with the mpiexec of the MPI that mpi4py loads, "
                    "rank-prefixed output, fail-fast and restarts.")
    p.add_argument("-np", "--num-proc", "-n", dest="np", type=int,
                   help="number of ranks (default in a Slurm allocation: SLURM_NTASKS)")
    p.add_argument("-H", "--hosts", help="hosts and slots, e.g. a:2,b:2 (default: this machine, "
                   "or the hosts and tasks of the Slurm allocation)")
    p.add_argument("--hostfile", "-hostfile", help="file of 'host slots=N' lines")
    add_remote_arguments(p)
    g = p.add_argument_group("engine knobs (HVDKERAS_* variables for every rank)")
    g.add_argument("--fusion-threshold-mb", type=float, help="fusion buffer size in MiB (0: no fusion)")
    g.add_argument("--cycle-time-ms", type=float, help="engine cycle time in ms")
    g.add_argument("--cache-capacity", type=int, help="response cache entries (0: off)")
    g.add_argument("--timeline-filename", help="rank 0 writes a Chrome trace here")
    g.add_argument("--timeline-mark-cycles", action="store_true", help="mark engine cycles in the timeline")
    g.add_argument("--autotune", action="store_true", help="tune fusion threshold and cycle time online")
    g.add_argument("--autotune-log-file", help="CSV log of autotune trials")
    g.add_argument("--stall-check-seconds", type=float, help="warn about stalled collectives after S s")
    g.add_argument("--no-stall-check", action="store_true", help="disable stall warnings")
    g.add_argument("--stall-shutdown-seconds", type=float, help="fail stalled collectives after S s")
    g.add_argument("--liveness-seconds", type=float,
                   help="end the job when another host is silent for S s (default 60; "
                        "at most half the stall bound; 0: off)")
    g.add_argument("--log-level", choices=sorted(LOG_LEVELS), type=str.lower,
                   help="HVDKERAS_LOG_LEVEL and TensorFlow's C++ log level")
    o = p.add_argument_group("job control")
    o.add_argument("--output-dir", "--output-filename", dest="output_dir",
                   help="also write rank.<r>.log per rank and launcher.log here")
    o.add_argument("--max-restarts", type=int, default=0,
                   help="relaunch the job up to K times after a failure (elastic jobs: default 3)")
    e = p.add_argument_group("elastic restarts (after a failure, relaunch on the ranks available)")
    e.add_argument("--min-np", type=int, help="fewest ranks to continue on (default: -np)")
    e.add_argument("--max-np", type=int, help="most ranks to run on (default: -np)")
    e.add_argument("--host-discovery-script",
                   help="executable printing the available 'host:slots', one per line")
    o.add_argument("--no-prefix", action="store_true", help="do not prefix output lines with the rank")
    o.add_argument("--mpi-args", default="", help="extra arguments for mpiexec, e.g. '-launcher slurm'")
    o.add_argument("--check-build", action="store_true", help="print what `hvdkeras check` prints and exit")
    o.add_argument("--verbose", action="store_true", help="print the mpiexec in use")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program to run on every rank")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.check_build:
        # In a fresh interpreter: `hvdkerasrun` runs without importing TensorFlow.
        return subprocess.call([sys.executable, "-m", "hvdkeras.cli", "check"])
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        # Inside a Slurm allocation its hosts and task count are the defaults,
        # and its other nodes are reached through Slurm.
        slurm_hosts, args.np, through_slurm = slurm.allocation_launch(
            os.environ, args.hosts, args.hostfile, args.np, args.ssh_command)
        # --mpi-args that choose how processes start win.
        through_slurm = through_slurm and not picks_own_launcher(shlex.split(args.mpi_args))
    except ValueError as exc:
        print(f"hvdkerasrun: error: {exc}", file=sys.stderr)
        return 2
    if slurm_hosts:
        args.hosts = hosts_argument(slurm_hosts)
        log(f"hosts from the Slurm allocation: {args.hosts}"
            + (" (started through srun)" if through_slurm else ""))
    if args.np is None:
        parser.error("-np N is required (outside a Slurm allocation)")
    if not command:
        parser.error("no COMMAND given (e.g. hvdkerasrun -np 2 python train.py)")
    knobs = Knobs(
        fusion_threshold_mb=args.fusion_threshold_mb, cycle_time_ms=args.cycle_time_ms,
        cache_capacity=args.cache_capacity, timeline_filename=args.timeline_filename,
        timeline_mark_cycles=args.timeline_mark_cycles, autotune=args.autotune,
        autotune_log_file=args.autotune_log_file, stall_check_seconds=args.stall_check_seconds,
        no_stall_check=args.no_stall_check, stall_shutdown_seconds=args.stall_shutdown_seconds,
        liveness_seconds=args.liveness_seconds,
        log_level=args.log_level)
    try:
        env = knob_env(knobs)
        if args.mpi_args:
            os.environ[mpi_env.MPIEXEC_ARGS_ENV] = args.mpi_args
        if args.verbose:
            mpiexec, vendor, library = resolve_mpiexec(command)
            log(f"mpiexec {mpiexec} ({mpi_env.VENDOR_NAMES[vendor]}) for libmpi {library.path}")
        remote = remote_access_from_args(args, through_slurm=through_slurm)
        return launch(command, args.np, hosts=args.hosts, hostfile=args.hostfile, env=env,
                      output_dir=args.output_dir, max_restarts=args.max_restarts,
                      prefix_output=not args.no_prefix, min_np=args.min_np, max_np=args.max_np,
                      host_discovery_script=args.host_discovery_script, remote=remote)
    except (ValueError, mpi_env.LauncherError) as exc:
        print(f"hvdkerasrun: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Which ``mpiexec`` to run, and the command line it gets.

The launcher must come from the same MPI as the library mpi4py loads: Open
MPI's launcher starting MPICH ranks makes every rank abort ("unsupported PMI
version PMIx"), and MPICH's Hydra starting Open MPI ranks silently gives N
worlds of size 1. The text-parsing and command-building parts are pure
functions; `probe_library` and `probe_launcher` run a subprocess each.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

from hvdkeras.runner.hosts import HostSlots, hosts_argument

MPICH = "mpich"
OPENMPI = "openmpi"
INTEL = "intel"
VENDOR_NAMES = {MPICH: "MPICH", OPENMPI: "Open MPI", INTEL: "Intel MPI"}

# Overrides the mpiexec choice (must still match the library).
MPIEXEC_ENV = "HVDKERAS_MPIEXEC"
# Extra arguments for mpiexec, split like a shell would (e.g. "-launcher slurm").
MPIEXEC_ARGS_ENV = "HVDKERAS_MPIEXEC_ARGS"
PROBE_TIMEOUT_S = 60


class LauncherError(RuntimeError):
    """No usable mpiexec: missing, or from a different MPI than mpi4py loads."""


def library_vendor(version_text: str) -> Optional[str]:
    """Vendor of an MPI library from ``MPI_Get_library_version`` text."""
    text = version_text.lower()
    if "open mpi" in text:
        return OPENMPI
    if "intel(r) mpi" in text or "intel mpi" in text:
        return INTEL
    if "mpich" in text or "mvapich" in text:
        return MPICH
    return None


def launcher_vendor(version_text: str) -> Optional[str]:
    """Vendor of an ``mpiexec`` from its ``--version`` output."""
    text = version_text.lower()
    if "open mpi" in text or "openrte" in text or "open-mpi" in text or "prrte" in text:
        return OPENMPI
    if "intel(r) mpi" in text or "intel mpi" in text:
        return INTEL
    if "hydra" in text or "mpich" in text:
        return MPICH
    return None


def mismatch_message(launcher: str, launcher_vendor_: Optional[str], library: str,
                     library_vendor_: Optional[str]) -> str:
    """Why a launcher cannot start ranks of this library, and what to do."""
    lname = VENDOR_NAMES.get(launcher_vendor_ or "", "an unknown MPI")
    bname = VENDOR_NAMES.get(library_vendor_ or "", "an unknown MPI")
    if launcher_vendor_ == OPENMPI and library_vendor_ in (MPICH, INTEL):
        effect = "every rank would abort at MPI_Init (the ranks do not speak Open MPI's PMIx)"
    elif launcher_vendor_ in (MPICH, INTEL) and library_vendor_ == OPENMPI:
        effect = "every rank would silently run as its own world of size 1"
    else:
        effect = "the ranks would not form one MPI world"
    return (f"mpiexec {launcher} belongs to {lname}, but mpi4py loads {bname} ({library}): "
            f"{effect}. Use the mpiexec of the MPI that mpi4py loads (unset {MPIEXEC_ENV} to "
            "let hvdkerasrun pick it, or put that MPI's bin/ first on PATH), or install "
            "mpi4py against the MPI whose mpiexec you want.")


@dataclasses.dataclass(frozen=True)
class MpiLibrary:
    """The MPI library that mpi4py loads in the rank interpreter."""

    path: str
    version: str
    vendor: Optional[str]


_PROBE = r"""
import json, os, re, sys
import mpi4py
mpi4py.rc.initialize = False
mpi4py.rc.finalize = False
from mpi4py import MPI
path = ""
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and re.match(r"libmpi(_\w+)?\.so", os.path.basename(fields[5].strip())):
            path = fields[5].strip()
            break
print(json.dumps({"path": path, "version": MPI.Get_library_version()}))
"""


def probe_library(python: str = sys.executable) -> MpiLibrary:
    """Asks `python` which libmpi mpi4py loads, without initialising MPI."""
    try:
        result = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                                timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LauncherError(f"could not ask {python} which MPI mpi4py loads: {exc}") from None
    if result.returncode != 0:
        raise LauncherError(f"{python} cannot import mpi4py's MPI module (is mpi4py installed "
                            f"with an MPI, e.g. `pip install mpi4py mpich`?):\n{result.stderr[-2000:]}")
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return MpiLibrary(path=data["path"], version=data["version"].strip(),
                      vendor=library_vendor(data["version"]))


def probe_launcher(mpiexec: str) -> str:
    """The ``--version`` text of `mpiexec` ("" when it cannot be run)."""
    try:
        result = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout + result.stderr


def candidate_mpiexecs(library_path: str, python: str = sys.executable,
                       environ: Optional[dict] = None) -> list[str]:
    """Where to look for mpiexec, best first (duplicates removed).

    1. ``$HVDKERAS_MPIEXEC`` when set (then it is the only candidate);
    2. ``<library prefix>/bin/mpiexec`` (the pip wheel's ``<venv>/lib/libmpi.so``
       -> ``<venv>/bin/mpiexec``; ``/opt/mpi/lib`` -> ``/opt/mpi/bin``);
    3. ``mpiexec`` next to the interpreter (a venv's ``bin/``, unresolved);
    4. ``mpiexec`` and ``mpirun`` on PATH.
    """
    environ = os.environ if environ is None else environ
    override = environ.get(MPIEXEC_ENV, "").strip()
    if override:
        return [override]
    found: list[str] = []
    if library_path:
        lib_dir = Path(library_path).parent
        for prefix in (lib_dir.parent, lib_dir.parent.parent):
            found.append(str(prefix / "bin" / "mpiexec"))
    found.append(str(Path(python).parent / "mpiexec"))
    for name in ("mpiexec", "mpirun"):
        which = shutil.which(name, path=environ.get("PATH"))
        if which:
            found.append(which)
    unique: list[str] = []
    for path in found:
        if path not in unique:
            unique.append(path)
    return unique


def choose_mpiexec(library: MpiLibrary, candidates: Sequence[str],
                   version_of=probe_launcher) -> tuple[str, str]:
    """First candidate whose vendor matches the library: (path, vendor).

    Raises LauncherError naming what was found when none matches.
    """
    seen: list[tuple[str, Optional[str]]] = []
    for path in candidates:
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            continue
        vendor = launcher_vendor(version_of(path))
        if library.vendor is not None and vendor == library.vendor:
            return path, vendor
        seen.append((path, vendor))
    if not seen:
        raise LauncherError(f"no mpiexec found (looked at {', '.join(candidates)}); install "
                            "the MPI's launcher, e.g. `pip install mpich`.")
    if library.vendor is None:
        raise LauncherError(f"cannot tell which MPI mpi4py loads ({library.path}: "
                            f"{library.version.splitlines()[0] if library.version else '?'}); "
                            f"set {MPIEXEC_ENV} to its mpiexec.")
    path, vendor = seen[0]
    raise LauncherError(mismatch_message(path, vendor, library.path, library.vendor))


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Everything `mpiexec_command` needs."""

    mpiexec: str
    vendor: str
    np: int
    hosts: Optional[list[HostSlots]] = None
    hostfile: Optional[str] = None  # a file in this vendor's format
    env_names: tuple[str, ...] = ()  # variables Open MPI must forward with -x
    as_root: bool = False
    extra_args: tuple[str, ...] = ()


def mpiexec_command(plan: LaunchPlan, program: Sequence[str]) -> list[str]:
    """The full mpiexec command line that starts `program` on every rank.

    >>> mpiexec_command(LaunchPlan("mpiexec", MPICH, 2), ["python", "x.py"])
    ['mpiexec', '-n', '2', 'python', 'x.py']
    """
    if plan.np < 1:
        raise ValueError(f"np must be >= 1, got {plan.np}.")
    cmd = [plan.mpiexec]
    if plan.vendor == OPENMPI:
        cmd += ["-np", str(plan.np)]
        if plan.as_root:
            cmd.append("--allow-run-as-root")
        # Open MPI refuses more ranks than cores and pins each rank to one core,
        # which starves TensorFlow's thread pools; Horovod passes the same.
        cmd += ["--oversubscribe", "--bind-to", "none", "--map-by", "slot"]
        if plan.hosts:
            cmd += ["-H", hosts_argument(plan.hosts)]
        elif plan.hostfile:
            cmd += ["--hostfile", plan.hostfile]
        for name in plan.env_names:
            cmd += ["-x", name]
    else:  # Hydra (MPICH, Intel MPI): forwards the whole environment by default.
        cmd += ["-n", str(plan.np)]
        if plan.hosts:
            cmd += ["-hosts", hosts_argument(plan.hosts)]
        elif plan.hostfile:
            cmd += ["-f", plan.hostfile]
    cmd += list(plan.extra_args)
    return cmd + list(program)


def forwarded_env_names(extra: Iterable[str], environ: dict) -> tuple[str, ...]:
    """Variables Open MPI must be told to forward: ours, HVDKERAS_*, PYTHONPATH, PATH."""
    names = list(extra)
    for name in environ:
        if name.startswith(("HVDKERAS_", "TF_")) or name in ("PYTHONPATH", "PATH",
                                                            "LD_LIBRARY_PATH", "PYTHONUNBUFFERED"):
            names.append(name)
    return tuple(dict.fromkeys(names))

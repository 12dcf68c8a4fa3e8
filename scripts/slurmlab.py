#!/usr/bin/env python3
"""A real Slurm cluster on the network lab's hosts.

    sudo python scripts/slurmlab.py up --hosts 3 [--name slurm]   # prints the lab, SLURM_CONF
    SLURM_CONF=/run/slurmlab-slurm/slurm.conf sbatch -N 3 job.sh   # from this machine
    sudo python scripts/slurmlab.py down [--name slurm]

`up` makes a network lab (scripts/netlab.py: each host a network namespace
with its own address, hostname, PIDs and /dev/shm), then starts Debian's
Slurm 22.05 on it: one `munged` for every host (its socket lies on the
shared filesystem, as on a cluster sharing a key), `slurmctld` on the first
host and `slurmd -N HOST` on each, all in the foreground (`-D`), each
entered through the lab's ssh stand-in so that a job step's processes live
in their node's namespaces. The cluster's files (slurm.conf, state, spool,
logs) lie under /run/slurmlab-<name>/; every Slurm command finds the
cluster through SLURM_CONF. Nodes track processes by their process tree
(proctrack/linuxproc) and bind no tasks (task/none); slurmd still opens its
cgroup plugin, so each node mounts cgroup v1 hierarchies in its own mount
namespace before slurmd starts (`ip netns exec` gives it a fresh /sys). No
ssh server runs on any node, as on many clusters: work reaches the nodes
only through Slurm.

Needs root, `ip`, `unshare` and the packages slurm-wlm and munge
(`bash scripts/setup_env.sh --cluster` installs them). `check` says whether
this machine can run the cluster, and why not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netlab  # noqa: E402

DEFAULT_NAME = "slurm"
DEFAULT_NET = 81
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
CGROUP_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "pids")
# Runs on a node before its slurmd, in the node's own mount namespace.
MOUNT_CGROUPS = ("mount -t tmpfs cgroup_root /sys/fs/cgroup && " + " && ".join(
    f"mkdir -p /sys/fs/cgroup/{c} && mount -t cgroup -o {c} cgroup /sys/fs/cgroup/{c}"
    for c in CGROUP_CONTROLLERS) + " && mkdir -p /sys/fs/cgroup/systemd && "
    "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd")
PROGRAMS = ("slurmctld", "slurmd", "munged", "sbatch", "srun", "squeue", "scontrol")
START_TIMEOUT_S = 60


def root_dir(name: str) -> Path:
    return Path(f"/run/slurmlab-{name}")


def conf_path(name: str) -> Path:
    return root_dir(name) / "slurm.conf"


def can_run() -> Optional[str]:
    """Why this machine cannot run the cluster, or None."""
    why = netlab.can_run()
    if why:
        return why
    missing = [p for p in PROGRAMS if shutil.which(p) is None
               and not Path("/usr/sbin", p).exists()]
    if missing:
        return (f"{', '.join(missing)} not installed (Debian's slurm-wlm and munge: "
                "bash scripts/setup_env.sh --cluster)")
    return None


def slurm_conf(lab: Dict, directory: Path, cpus: int) -> str:
    """slurm.conf for the lab's hosts: the first runs slurmctld, each runs a
    slurmd. Short timeouts so that a lost node is noticed within a minute. Pure."""
    hosts = lab["hosts"]
    lines = [
        f"ClusterName={lab['name'].replace('-', '')}",
        f"SlurmctldHost={hosts[0]['host']}({hosts[0]['address']})",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "SlurmctldTimeout=30",
        "MessageTimeout=10",
        "KillWait=10",
        "InactiveLimit=0",
        "MinJobAge=30",
        "JobRequeue=1",
        # A requeued job waits out the step credentials' lifetime before it
        # may start again (120 s by default); the lab's steps start in
        # seconds, so a short lifetime keeps requeue tests quick.
        "AuthInfo=cred_expire=20",
        f"StateSaveLocation={directory / 'state'}",
        f"SlurmdSpoolDir={directory / 'spool-%n'}",
        f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
        f"SlurmdPidFile={directory / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={directory / 'slurmctld.log'}",
        f"SlurmdLogFile={directory / 'slurmd-%n.log'}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
    ]
    for h in hosts:
        lines.append(f"NodeName={h['host']} NodeAddr={h['address']} CPUs={cpus} "
                     "RealMemory=2000 State=UNKNOWN")
    lines.append(f"PartitionName=lab Nodes={','.join(h['host'] for h in hosts)} Default=YES "
                 "MaxTime=INFINITE State=UP OverSubscribe=FORCE:4")
    return "\n".join(lines) + "\n"


def _start_munge() -> None:
    """One munged for every host (the lab's hosts share this filesystem)."""
    if MUNGE_SOCKET.exists() and subprocess.run(
            ["munge", "-n"], capture_output=True).returncode == 0:
        return
    MUNGE_SOCKET.parent.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_SOCKET.parent, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged", "--force"], check=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    raise RuntimeError("slurmlab: munged did not start")


def scontrol(name: str, *args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "SLURM_CONF": str(conf_path(name))})


def nodes_idle(name: str) -> Dict[str, str]:
    """Node -> state, from sinfo."""
    out = subprocess.run(["sinfo", "-N", "-h", "-o", "%N %T"], capture_output=True, text=True,
                         timeout=20, env={**os.environ, "SLURM_CONF": str(conf_path(name))})
    states = {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


def _start_slurmd(name: str, host: str) -> int:
    # slurmd is the first process of its host's PID namespace: killing it
    # ends every process on the host, as a node crash does (link still up).
    return netlab.start_daemon(
        name, host, f"{MOUNT_CGROUPS} && exec slurmd -D -N {host} -f {conf_path(name)}",
        root_dir(name) / f"slurmd-{host}.out")


def restart_slurmd(name: str, host: str) -> None:
    """Starts `host`'s slurmd again (after a test killed it); Slurm returns
    the node to service by itself (ReturnToService=2)."""
    state_file = root_dir(name) / "state.json"
    state = json.loads(state_file.read_text())
    state["pids"].append(_start_slurmd(name, host))
    state_file.write_text(json.dumps(state))


def up(name: str, count: int, net: int) -> Dict:
    why = can_run()
    if why:
        raise SystemExit(f"slurmlab: cannot run here: {why}")
    down(name)
    lab = netlab.up(name, count, net, None)
    directory = root_dir(name)
    if directory.exists():
        shutil.rmtree(directory)
    (directory / "state").mkdir(parents=True)
    for h in lab["hosts"]:
        (directory / f"spool-{h['host']}").mkdir()
    conf_path(name).write_text(slurm_conf(lab, directory, os.cpu_count() or 2))
    (directory / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
    _start_munge()
    conf = conf_path(name)
    pids = [netlab.start_daemon(name, lab["hosts"][0]["host"], f"exec slurmctld -D -i -f {conf}",
                                directory / "slurmctld.out")]
    time.sleep(1.0)
    for h in lab["hosts"]:
        pids.append(_start_slurmd(name, h["host"]))
    state = {"lab": lab, "conf": str(conf), "pids": pids}
    (directory / "state.json").write_text(json.dumps(state))
    deadline = time.monotonic() + START_TIMEOUT_S
    wanted = {h["host"] for h in lab["hosts"]}
    states: Dict[str, str] = {}
    while time.monotonic() < deadline:
        try:
            states = nodes_idle(name)
        except subprocess.TimeoutExpired:
            states = {}
        if wanted <= {n for n, s in states.items() if s == "idle"}:
            return state
        time.sleep(1.0)
    logs = "".join(f"\n--- {p.name}\n" + p.read_text()[-1500:]
                   for p in sorted(directory.glob("*.out")) + sorted(directory.glob("*.log")))
    down(name)
    raise RuntimeError(f"slurmlab: the nodes did not come up in {START_TIMEOUT_S} s "
                       f"(sinfo: {states}){logs}")


def down(name: str) -> None:
    """Stops the daemons and removes the lab and the cluster's files."""
    netlab.remove_cluster(name, root_dir(name))


def main(argv: List[str]) -> int:
    return netlab.cluster_main(argv, __doc__, "Slurm", DEFAULT_NAME, DEFAULT_NET, can_run, up,
                               down, after_up=lambda state: f"export SLURM_CONF={state['conf']}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Hosts of their own on one machine: a network-namespace lab for multi-host runs.

    sudo python scripts/netlab.py up --hosts 2 [--rate 1gbit] [--name hvk]
    python scripts/netlab.py ssh [ssh options] h1 'command ...'   # how mpiexec enters a host
    sudo python scripts/netlab.py cut h1 / mend h1               # take a host's link down / up
    sudo python scripts/netlab.py crash h1                       # link down, then kill all on it
    sudo python scripts/netlab.py rate 2gbit                     # shape every link anew (or none)
    sudo python scripts/netlab.py down [--name hvk]

Each host is a network namespace with its own address (10.<net>.0.<i+1> on
a veth pair joined to a bridge; the machine itself is 10.<net>.0.254 on the
bridge) and its own name in /etc/hosts (h0, h1, ... with the lab's name as
a prefix when it is not "hvk"). `ssh` is the stand-in for ssh that MPI
launchers call as `CMD [options] HOST COMMAND`: it runs COMMAND in HOST's
network namespace and in new UTS, IPC, PID and mount namespaces with the
host's hostname and a private /dev/shm, so ranks on different lab hosts
share no hostname, no PIDs, no System V IPC and no shared memory: MPI must
talk over the network, as between real machines. Everything one `ssh`
starts shares those namespaces (MPICH's hydra starts one proxy per host,
which starts the host's ranks).

`--rate` shapes every host's link in both directions with a token bucket
(tc tbf); this kernel has no netem, so no added delay. `down` kills every
process inside the lab's namespaces and removes the namespaces, links,
bridge and /etc/hosts lines: nothing is left. The state of a lab is
recorded in /run/netlab-<name>.json.

Needs root and `ip` (iproute2), `tc`, `unshare`. `python scripts/netlab.py
check` says whether this machine can run a lab, and why not.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

HOSTS_FILE = Path("/etc/hosts")
DEFAULT_NAME = "hvk"
DEFAULT_NET = 77
SHM_SIZE = "4g"  # a host's private /dev/shm (tmpfs: memory is used only when written)


def state_path(name: str) -> Path:
    return Path(f"/run/netlab-{name}.json")


def run(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"netlab: {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def host_names(name: str, count: int) -> List[str]:
    """h0, h1, ... (prefixed with the lab's name unless it is the default). Pure."""
    prefix = "" if name == DEFAULT_NAME else f"{name}-"
    return [f"{prefix}h{i}" for i in range(count)]


def layout(name: str, count: int, net: int) -> Dict:
    """Every name and address of a lab of `count` hosts. Pure."""
    hosts = []
    for i, host in enumerate(host_names(name, count)):
        hosts.append({"host": host, "namespace": f"{name}-{host}" if not host.startswith(name)
                      else host, "address": f"10.{net}.0.{i + 1}",
                      "outer": f"{name}v{i}", "inner": "eth0"})
    return {"name": name, "bridge": f"{name}br", "launcher": f"10.{net}.0.254", "net": net,
            "hosts": hosts}


def can_run() -> Optional[str]:
    """None when this machine can make a lab, else why not."""
    if os.geteuid() != 0:
        return "the lab needs root (network namespaces, links, /etc/hosts)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"the lab needs `{tool}`, which is not installed"
    probe = "netlab-probe"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"network namespaces are not available: {made.stderr.strip()}"
    run("ip", "netns", "delete", probe, check=False)
    return None


def _hosts_lines(lab: Dict) -> List[str]:
    return [f"{h['address']} {h['host']}  # netlab {lab['name']}" for h in lab["hosts"]]


def _write_hosts(lab: Dict, add: bool) -> None:
    lines = [line for line in HOSTS_FILE.read_text().splitlines()
             if not line.endswith(f"# netlab {lab['name']}")]
    if add:
        lines += _hosts_lines(lab)
    tmp = HOSTS_FILE.with_name(".hosts.netlab")
    tmp.write_text("\n".join(lines) + "\n")
    # /etc/hosts may be a bind mount: rewrite it in place rather than replace it.
    HOSTS_FILE.write_text(tmp.read_text())
    tmp.unlink()


def shape(device: str, rate: str, namespace: Optional[str] = None) -> None:
    """A token bucket of `rate` on `device`'s egress (burst: 1 ms of the rate)."""
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    bits = parse_rate(rate)
    burst = max(int(bits / 8 / 1000), 32 * 1024)
    run(*prefix, "tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
        "burst", str(burst), "latency", "50ms")


def reshape(name: str, rate: str) -> None:
    """Shapes every link of lab `name` to `rate` ("none": unshaped)."""
    lab = load(name)
    for h in lab["hosts"]:
        for device, namespace in ((h["outer"], None), (h["inner"], h["namespace"])):
            if rate == "none":
                prefix = ["ip", "netns", "exec", namespace] if namespace else []
                run(*prefix, "tc", "qdisc", "del", "dev", device, "root", check=False, quiet=True)
            else:
                shape(device, rate, namespace)
    lab["rate"] = None if rate == "none" else rate
    state_path(name).write_text(json.dumps(lab))


def parse_rate(rate: str) -> float:
    """Bits per second of a tc rate ("1gbit", "500mbit", "10gbit"). Pure."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for unit, factor in units.items():
        if rate.lower().endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"netlab: a rate like 1gbit or 500mbit, not {rate!r}")


def up(name: str, count: int, net: int, rate: Optional[str]) -> Dict:
    if state_path(name).exists():
        down(name)
    lab = layout(name, count, net)
    lab["rate"] = rate
    run("ip", "link", "add", lab["bridge"], "type", "bridge")
    run("ip", "addr", "add", f"{lab['launcher']}/24", "dev", lab["bridge"])
    run("ip", "link", "set", lab["bridge"], "up")
    for h in lab["hosts"]:
        ns = h["namespace"]
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", h["outer"], "type", "veth", "peer", "name", "netlabtmp")
        run("ip", "link", "set", "netlabtmp", "netns", ns)
        run("ip", "netns", "exec", ns, "ip", "link", "set", "netlabtmp", "name", h["inner"])
        run("ip", "link", "set", h["outer"], "master", lab["bridge"])
        run("ip", "link", "set", h["outer"], "up")
        run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{h['address']}/24", "dev",
            h["inner"])
        run("ip", "netns", "exec", ns, "ip", "link", "set", h["inner"], "up")
        run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        if rate:
            shape(h["outer"], rate)            # towards the host
            shape(h["inner"], rate, ns)        # from the host
    _write_hosts(lab, add=True)
    state_path(name).write_text(json.dumps(lab))
    return lab


def load(name: str) -> Dict:
    try:
        return json.loads(state_path(name).read_text())
    except FileNotFoundError:
        raise SystemExit(f"netlab: no lab named {name!r} is up (run `netlab.py up`)") from None


def _kill_inside(namespace: str) -> int:
    """SIGKILLs every process in a host's network namespace; how many."""
    pids = run("ip", "netns", "pids", namespace, check=False).stdout.split()
    killed = 0
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
        except (ProcessLookupError, ValueError):
            pass
    return killed


def down(name: str) -> None:
    """Kills everything inside the lab and removes every trace of it."""
    try:
        lab = json.loads(state_path(name).read_text())
    except FileNotFoundError:
        return
    for h in lab["hosts"]:
        _kill_inside(h["namespace"])
    time.sleep(0.2)
    for h in lab["hosts"]:
        run("ip", "link", "delete", h["outer"], check=False)
        run("ip", "netns", "delete", h["namespace"], check=False)
    run("ip", "link", "delete", lab["bridge"], check=False)
    _write_hosts(lab, add=False)
    state_path(name).unlink(missing_ok=True)


def leftovers(name: str) -> List[int]:
    """Pids still running inside the lab's namespaces."""
    lab = load(name)
    pids: List[int] = []
    for h in lab["hosts"]:
        out = run("ip", "netns", "pids", h["namespace"], check=False).stdout.split()
        pids += [int(p) for p in out if p.isdigit()]
    return pids


def find_host(lab: Dict, target: str) -> Dict:
    for h in lab["hosts"]:
        if target in (h["host"], h["address"], h["namespace"]):
            return h
    raise SystemExit(f"netlab: {target!r} is not a host of lab {lab['name']!r} "
                     f"({', '.join(h['host'] for h in lab['hosts'])})")


def ssh_target(argv: List[str]) -> tuple:
    """(host, command) from ssh-style arguments: options, then HOST, then the
    command words (joined as ssh joins them). Options that take a value
    (-p, -i, -o, -l, -F, -E, -b, -c, -J) skip it. Pure."""
    with_value = set("pioFlEbcJLRDWmQSw")
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        flag = argv[i]
        if len(flag) == 2 and flag[1] in with_value:
            i += 2
        else:
            i += 1
    if i < len(argv) and argv[i] == "--":
        i += 1
    if i >= len(argv):
        raise SystemExit("netlab ssh: no host given")
    host = argv[i].split("@", 1)[-1]
    return host, " ".join(argv[i + 1:])


def ssh(name: str, argv: List[str]) -> int:
    """Runs a command on a lab host, as ssh would on a real one."""
    host, command = ssh_target(argv)
    h = find_host(load(name), host)
    inner = (f"hostname {shlex.quote(h['host'])} && "
             f"mount -t tmpfs -o size={SHM_SIZE} tmpfs /dev/shm && "
             f"exec sh -c {shlex.quote(command or 'exec sh')}")
    os.execvp("ip", ["ip", "netns", "exec", h["namespace"], "unshare", "--uts", "--ipc",
                     "--pid", "--mount", "--fork", "--kill-child", "--mount-proc",
                     "sh", "-c", inner])
    return 0


def start_daemon(name: str, host: str, command: str, log: Path,
                 env: Optional[Dict[str, str]] = None) -> int:
    """Starts `command` on a lab host (through `ssh`: its namespaces) in a
    session of its own, as a cluster's daemon kept in the foreground, its
    output appended to `log`. Returns the pid of the stand-in that holds it
    (the session's leader: `stop_daemons` ends the whole session)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--name", name, "ssh", host, command],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
    return proc.pid


def stop_daemons(state_file: Path) -> Dict:
    """SIGKILLs the sessions of the daemons whose pids a cluster recorded in
    `state_file` ({"pids": [...], ...}); returns that state ({} without one)."""
    try:
        state = json.loads(state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    for pid in state.get("pids", []):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return state


def remove_cluster(name: str, directory: Path) -> Dict:
    """Ends a cluster lab: its daemons (`stop_daemons` on directory/state.json),
    the lab itself and the cluster's files. Returns the recorded state."""
    state = stop_daemons(directory / "state.json")
    down(name)
    shutil.rmtree(directory, ignore_errors=True)
    return state


def cluster_main(argv: List[str], description: str, what: str, default_name: str,
                 default_net: int, can_run_cluster, up_cluster, down_cluster,
                 after_up=None) -> int:
    """The command line every cluster lab shares: up --hosts N [--net K],
    down and check, each with --name. `up` prints the cluster's state, then
    `after_up(state)` when given (a line telling users how to reach it)."""
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--name", default=default_name)
    sub = parser.add_subparsers(dest="action", required=True)
    p_up = sub.add_parser("up", help=f"make the hosts and start {what} on them")
    p_up.add_argument("--hosts", type=int, default=3)
    p_up.add_argument("--net", type=int, default=default_net, help="10.NET.0.0/24")
    sub.add_parser("down", help=f"stop {what} and remove the lab")
    sub.add_parser("check", help="whether this machine can run the cluster")
    args = parser.parse_args(argv)
    if args.action == "check":
        why = can_run_cluster()
        print(why or f"this machine can run a {what} cluster on a network lab")
        return 1 if why else 0
    if args.action == "up":
        state = up_cluster(args.name, args.hosts, args.net)
        print(json.dumps(state, indent=1))
        if after_up:
            print(after_up(state))
    else:
        down_cluster(args.name)
    return 0


def link(name: str, host: str, state: str) -> None:
    h = find_host(load(name), host)
    run("ip", "link", "set", h["outer"], state)


def crash(name: str, host: str) -> int:
    """A host losing its power: its link goes down first (so its peers get
    no goodbye, no FIN or RST), then every process on it is SIGKILLed.
    `mend` brings the link back for the next job. Returns how many were killed."""
    h = find_host(load(name), host)
    run("ip", "link", "set", h["outer"], "down")
    return _kill_inside(h["namespace"])


def main(argv: List[str]) -> int:
    # `ssh` takes ssh's own options, which argparse would claim: handled first.
    name = os.environ.get("NETLAB_NAME", DEFAULT_NAME)
    rest = list(argv)
    if rest[:1] == ["--name"] and len(rest) > 2:
        name, rest = rest[1], rest[2:]
    if rest[:1] == ["ssh"]:
        return ssh(name, rest[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default=os.environ.get("NETLAB_NAME", DEFAULT_NAME))
    sub = parser.add_subparsers(dest="action", required=True)
    p_up = sub.add_parser("up", help="make the hosts")
    p_up.add_argument("--hosts", type=int, default=2)
    p_up.add_argument("--net", type=int, default=DEFAULT_NET, help="10.NET.0.0/24")
    p_up.add_argument("--rate", help="shape each link, e.g. 1gbit")
    sub.add_parser("down", help="remove the lab and everything in it")
    p_rate = sub.add_parser("rate", help="shape every link anew (none: unshaped)")
    p_rate.add_argument("rate", help="e.g. 2gbit, or none")
    sub.add_parser("check", help="whether this machine can run a lab")
    sub.add_parser("status", help="the lab's hosts and the processes in them")
    sub.add_parser("ssh", help="ssh stand-in: [ssh options] HOST COMMAND")
    for action, what in (("cut", "take a host's link down"), ("mend", "bring it back up"),
                         ("crash", "take a host's link down and kill everything on it")):
        p = sub.add_parser(action, help=what)
        p.add_argument("host")
    args = parser.parse_args(argv)
    if args.action == "check":
        why = can_run()
        print(why or "this machine can run a network-namespace lab")
        return 1 if why else 0
    if args.action == "up":
        lab = up(args.name, args.hosts, args.net, args.rate)
        print(json.dumps(lab, indent=1))
    elif args.action == "down":
        down(args.name)
    elif args.action == "rate":
        reshape(args.name, args.rate)
    elif args.action == "status":
        lab = load(args.name)
        print(json.dumps({**lab, "pids": leftovers(args.name)}, indent=1))
    elif args.action == "crash":
        print(f"killed {crash(args.name, args.host)} process(es) on {args.host}")
    else:
        link(args.name, args.host, "down" if args.action == "cut" else "up")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

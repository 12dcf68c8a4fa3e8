#!/usr/bin/env python3
"""A Ray cluster on the network lab's hosts.

    sudo python scripts/raylab.py up --hosts 3 [--name ray]   # prints the head's address
    RAY_AUTH_MODE=disabled python driver.py     # ray.init("ray://10.85.0.1:10001")
    sudo python scripts/raylab.py down [--name ray]

`up` makes a network lab (scripts/netlab.py: each host a network namespace
with its own address, hostname, PIDs and /dev/shm) and runs `ray start
--head` on the first host and `ray start --address` on each other one, each
in the foreground (`--block`) with one CPU, entered through the lab's ssh
stand-in. A driver on this machine joins through Ray Client,
`ray.init("ray://10.<net>.0.1:10001")`, with RAY_AUTH_MODE=disabled and
HVDKERAS_RAY_DRIVER_HOST=10.<net>.0.254 (where the actors reach it); a
driver started on the head through the ssh stand-in hangs in ray.init.
Logs lie under /run/raylab-<name>/.

Needs root, `ip`, `unshare` and the `ray` command of the project's
environment (the [ray] extra). `check` says whether this machine can run
the cluster, and why not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netlab  # noqa: E402

DEFAULT_NAME = "ray"
DEFAULT_NET = 85
HEAD_PORT = 6379
CLIENT_PORT = 10001  # Ray Client's server on the head (ray start --head's default)
START_TIMEOUT_S = 120
RAY = Path(sys.executable).parent / "ray"


def root_dir(name: str) -> Path:
    return Path(f"/run/raylab-{name}")


def can_run() -> Optional[str]:
    why = netlab.can_run()
    if why:
        return why
    if not RAY.exists():
        return f"{RAY} is not installed (pip install -e '.[ray]')"
    return None


def temp_dir(name: str, host: str) -> Path:
    return root_dir(name) / "tmp" / host


def lab_env() -> Dict[str, str]:
    """The daemons' and drivers' environment: no usage reports, and no token
    authentication (a token that an earlier local `ray.init()` left in
    ~/.ray would switch it on for some processes and not others; the lab's
    network is this machine's own)."""
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def head_address(lab: Dict) -> str:
    return f"{lab['hosts'][0]['address']}:{HEAD_PORT}"


def _daemon(name: str, host: str, command: str, log: Path) -> int:
    return netlab.start_daemon(name, host, command, log, lab_env())


def client_address(lab: Dict) -> str:
    return f"ray://{lab['hosts'][0]['address']}:{CLIENT_PORT}"


def alive_nodes(lab: Dict) -> int:
    """Nodes alive, asked through Ray Client from this machine (a driver run
    on the head through the ssh stand-in hangs in ray.init)."""
    script = (f"import ray; ray.init({client_address(lab)!r}, logging_level='ERROR'); "
              "print('NODES', sum(1 for n in ray.nodes() if n['Alive']))")
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             timeout=60, stdin=subprocess.DEVNULL, env=lab_env())
    except subprocess.TimeoutExpired:
        return 0
    for line in out.stdout.splitlines():
        if line.startswith("NODES "):
            return int(line.split()[1])
    return 0


def up(name: str, count: int, net: int) -> Dict:
    why = can_run()
    if why:
        raise SystemExit(f"raylab: cannot run here: {why}")
    down(name)
    lab = netlab.up(name, count, net, None)
    directory = root_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    first = lab["hosts"][0]
    common = "--num-cpus 1 --object-store-memory 300000000 --block --disable-usage-stats"
    # A temporary directory per host: the hosts share this filesystem, and
    # each host's first process has pid 1, so their session names would meet.
    pids = [_daemon(name, first["host"],
                    f"exec {RAY} start --head --node-ip-address {first['address']} "
                    f"--port {HEAD_PORT} --include-dashboard false "
                    f"--temp-dir {temp_dir(name, first['host'])} {common}",
                    directory / f"{first['host']}.out")]
    state = {"lab": lab, "address": head_address(lab), "pids": pids}  # read by down()
    (directory / "state.json").write_text(json.dumps(state))
    deadline = time.monotonic() + START_TIMEOUT_S
    while "Ray runtime started" not in _read(directory / f"{first['host']}.out"):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for h in lab["hosts"][1:]:
        pids.append(_daemon(name, h["host"],
                            f"exec {RAY} start --address {head_address(lab)} "
                            f"--node-ip-address {h['address']} "
                            f"--temp-dir {temp_dir(name, h['host'])} {common}",
                            directory / f"{h['host']}.out"))
    (directory / "state.json").write_text(json.dumps(state))
    while time.monotonic() < deadline:
        if alive_nodes(lab) >= count:
            return state
        time.sleep(1.0)
    logs = "".join(f"\n--- {p.name}\n{_read(p)[-1500:]}" for p in sorted(directory.glob("*.out")))
    down(name)
    raise RuntimeError(f"raylab: the nodes did not join in {START_TIMEOUT_S} s{logs}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def down(name: str) -> None:
    state = netlab.remove_cluster(name, root_dir(name))
    # A head started without a temporary directory of its own records its
    # address for this machine's later ray.init() calls: not the lab's.
    current = Path("/tmp/ray/ray_current_cluster")
    lab = state.get("lab")
    if lab and current.exists() and current.read_text().strip() == head_address(lab):
        current.unlink()


def main(argv: List[str]) -> int:
    return netlab.cluster_main(argv, __doc__, "Ray", DEFAULT_NAME, DEFAULT_NET, can_run, up,
                               down)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

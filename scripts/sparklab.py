#!/usr/bin/env python3
"""A Spark standalone cluster on the network lab's hosts.

    sudo python scripts/sparklab.py up --hosts 3 [--name spark]   # prints the master's URL
    sudo python scripts/sparklab.py down [--name spark]

`up` makes a network lab (scripts/netlab.py: each host a network namespace
with its own address, hostname, PIDs and /dev/shm) and starts Spark's own
standalone daemons from the pyspark that the project's environment installs:
the master on the first host and one worker per host (one core each, so a
barrier stage of N tasks takes N hosts), each in the foreground, entered
through the lab's ssh stand-in. A driver on this machine reaches the master
at spark://10.<net>.0.1:7077 and must tell the executors its own address on
the lab (`spark.driver.host`, 10.<net>.0.254). Logs lie under
/run/sparklab-<name>/.

Needs root, `ip`, `unshare`, java and pyspark. `check` says whether this
machine can run the cluster, and why not.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import netlab  # noqa: E402

DEFAULT_NAME = "spark"
DEFAULT_NET = 83
MASTER_PORT = 7077
START_TIMEOUT_S = 90


def root_dir(name: str) -> Path:
    return Path(f"/run/sparklab-{name}")


def spark_home() -> Optional[Path]:
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).resolve().parent


def can_run() -> Optional[str]:
    why = netlab.can_run()
    if why:
        return why
    if shutil.which("java") is None:
        return "java is not installed (Spark needs a JVM)"
    if spark_home() is None:
        return "pyspark is not installed (pip install -e '.[spark]')"
    return None


def master_url(lab: Dict) -> str:
    return f"spark://{lab['hosts'][0]['address']}:{MASTER_PORT}"


def _daemon(name: str, host: Dict, command: str, log: Path) -> int:
    env = {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": host["address"],
           "PYSPARK_PYTHON": sys.executable, "SPARK_LOG_DIR": str(log.parent),
           "SPARK_WORKER_DIR": str(log.parent / f"work-{host['host']}")}
    return netlab.start_daemon(name, host["host"], command, log, env)


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=1.0):
            return True
    except OSError:
        return False


def up(name: str, count: int, net: int) -> Dict:
    why = can_run()
    if why:
        raise SystemExit(f"sparklab: cannot run here: {why}")
    down(name)
    lab = netlab.up(name, count, net, None)
    directory = root_dir(name)
    directory.mkdir(parents=True, exist_ok=True)
    spark_class = spark_home() / "bin" / "spark-class"
    first = lab["hosts"][0]
    pids = [_daemon(name, first, f"exec {spark_class} org.apache.spark.deploy.master.Master "
                                 f"--host {first['address']} --port {MASTER_PORT} "
                                 "--webui-port 8080", directory / "master.out")]
    state = {"lab": lab, "master": master_url(lab), "pids": pids}
    (directory / "state.json").write_text(json.dumps(state))
    deadline = time.monotonic() + START_TIMEOUT_S
    while not _answers(first["address"], MASTER_PORT) and time.monotonic() < deadline:
        time.sleep(0.5)
    for h in lab["hosts"]:
        pids.append(_daemon(name, h, f"exec {spark_class} org.apache.spark.deploy.worker.Worker "
                                     f"--host {h['address']} --cores 1 --memory 3g "
                                     f"{master_url(lab)}", directory / f"worker-{h['host']}.out"))
    (directory / "state.json").write_text(json.dumps(state))
    while time.monotonic() < deadline:
        if all("Successfully registered with master" in _read(directory / f"worker-{h['host']}.out")
               for h in lab["hosts"]):
            return state
        time.sleep(0.5)
    logs = "".join(f"\n--- {p.name}\n{_read(p)[-1500:]}" for p in sorted(directory.glob("*.out")))
    down(name)
    raise RuntimeError(f"sparklab: the workers did not register in {START_TIMEOUT_S} s{logs}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def down(name: str) -> None:
    netlab.remove_cluster(name, root_dir(name))


def main(argv: List[str]) -> int:
    return netlab.cluster_main(argv, __doc__, "Spark standalone", DEFAULT_NAME, DEFAULT_NET, can_run, up,
                               down)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

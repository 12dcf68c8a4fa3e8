"""hvdkeras on a Ray cluster across the network lab's hosts.

`scripts/raylab.py` runs `ray start --head` on the first lab host and `ray
start --address` on two more (hosts of their own: address, hostname, PIDs,
/dev/shm), each node with one CPU, so three ranks of one CPU each land on
three hosts. A driver process on this machine joins through Ray Client
(tests/scripts/ray_lab_driver.py) and runs:

* `hvdkeras.ray.run`: exact sums from ranks on three different hosts;
* a node's host lost mid-run (link down, every process on it killed): the
  run ends within the liveness bound with RankFailedError naming the host.

They need root, `ip netns` and the [ray] extra; elsewhere they skip, saying why.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdkeras.ray.runner import DRIVER_HOST_ENV
from lab_drivers import finish, lose_a_rank_host
from mpi_runner import _child_env, tail

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(REPO / "scripts"))
import raylab  # noqa: E402

NAME = "hvkray"
NET = 86
DRIVER = TESTS / "scripts" / "ray_lab_driver.py"
LIVENESS_S = 10  # the lost-host run's HVDKERAS_LIVENESS_SECONDS
WHY_NOT = raylab.can_run()
pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no Ray cluster here: {WHY_NOT}")]


@pytest.fixture(scope="module")
def cluster():
    state = raylab.up(NAME, 3, NET)
    try:
        yield state
    finally:
        raylab.down(NAME)


def driver(cluster: dict, mode: str, ready_dir: Path) -> subprocess.Popen:
    env = {k: v for k, v in raylab.lab_env().items() if k.startswith("RAY_")}
    env[DRIVER_HOST_ENV] = cluster["lab"]["launcher"]  # where the actors reach the driver
    return subprocess.Popen(
        [sys.executable, str(DRIVER), raylab.client_address(cluster["lab"]), "3", mode,
         str(ready_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, errors="replace", env=_child_env(env),
        start_new_session=True)


@pytest.mark.timeout(700)
def test_ray_run_puts_the_ranks_on_three_hosts(cluster, tmp_path):
    out = finish(driver(cluster, "run", tmp_path), 300)
    ranks = re.findall(r"RESULT rank (\d) host (\S+) sum 6\b", out)
    assert sorted(r for r, _ in ranks) == ["0", "1", "2"], tail(out)
    hosts = {h["host"] for h in cluster["lab"]["hosts"]}
    assert {host for _, host in ranks} == hosts, (ranks, hosts)


@pytest.mark.timeout(400)
def test_a_lost_ray_node_ends_the_run_naming_its_host(cluster, tmp_path):
    proc = driver(cluster, "lost", tmp_path)
    # A host that holds neither rank 0 nor Ray's head.
    lose_a_rank_host(proc, tmp_path, NAME, cluster["lab"]["hosts"][0]["host"], LIVENESS_S,
                     "Ray node")

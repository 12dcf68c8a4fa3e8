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
import time
from pathlib import Path

import pytest

from hvdkeras.ray.runner import DRIVER_HOST_ENV
from mpi_runner import _child_env, _kill_group, tail

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(REPO / "scripts"))
import netlab  # noqa: E402
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


def finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise AssertionError(f"the driver did not finish in {timeout} s:\n"
                             f"{tail(proc.communicate(timeout=10)[0])}") from None
    return out


@pytest.mark.timeout(400)
def test_ray_run_puts_the_ranks_on_three_hosts(cluster, tmp_path):
    out = finish(driver(cluster, "run", tmp_path), 300)
    ranks = re.findall(r"RESULT rank (\d) host (\S+) sum 6\b", out)
    assert sorted(r for r, _ in ranks) == ["0", "1", "2"], tail(out)
    hosts = {h["host"] for h in cluster["lab"]["hosts"]}
    assert {host for _, host in ranks} == hosts, (ranks, hosts)


@pytest.mark.timeout(400)
def test_a_lost_ray_node_ends_the_run_naming_its_host(cluster, tmp_path):
    proc = driver(cluster, "lost", tmp_path)
    deadline = time.monotonic() + 240
    while len(list(tmp_path.glob("ready.[0-9]"))) < 3 and time.monotonic() < deadline:
        assert proc.poll() is None, tail(proc.communicate()[0])
        time.sleep(0.5)
    placed = {int(p.suffix[1:]): p.read_text() for p in tmp_path.glob("ready.[0-9]")}
    assert len(placed) == 3, placed
    # A node's host that holds neither rank 0 nor Ray's head.
    head_host = cluster["lab"]["hosts"][0]["host"]
    lost_rank, lost = next((r, h) for r, h in sorted(placed.items())
                           if r != 0 and h not in (placed[0], head_host))
    killed = netlab.crash(NAME, lost)
    crashed_at = time.monotonic()
    out = finish(proc, 200)
    took = time.monotonic() - crashed_at
    print(f"\nlost Ray node host {lost} ({killed} processes killed): the run ended "
          f"{took:.1f} s later")
    print(next((line for line in out.splitlines() if line.startswith("FAILED")), ""))
    assert re.search(rf"FAILED after .*host\(s\) {lost} \(rank\(s\) {lost_rank}\) sent nothing",
                     out, re.S), tail(out)
    assert "UNREACHABLE" not in out
    assert took < LIVENESS_S + 40, took

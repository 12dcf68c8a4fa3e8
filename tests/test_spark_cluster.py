"""hvdkeras on a Spark standalone cluster across the network lab's hosts.

`scripts/sparklab.py` starts Spark's master on the first lab host and one
worker of one core on each of three (hosts of their own: address, hostname,
PIDs, /dev/shm), so a barrier stage of three tasks spans three hosts, as
HorovodRunner's jobs do. A driver process on this machine
(tests/scripts/spark_lab_driver.py) runs:

* `hvdkeras.spark.run`: exact sums from ranks on three different hosts;
* `KerasEstimator.fit` on the bundled digits, then `transform`: accuracy,
  and the executors' addresses (three hosts);
* a worker's host lost mid-run (link down, every process on it killed): the
  run ends within the liveness bound with RankFailedError naming the host.

They need root, `ip netns`, java and pyspark; elsewhere they skip, saying why.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab_drivers import finish, lose_a_rank_host
from mpi_runner import _child_env, tail

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
sys.path.insert(0, str(REPO / "scripts"))
import sparklab  # noqa: E402

NAME = "hvksp"
NET = 84
DRIVER = TESTS / "scripts" / "spark_lab_driver.py"
LIVENESS_S = 10  # the lost-host run's HVDKERAS_LIVENESS_SECONDS
WHY_NOT = sparklab.can_run()
pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no Spark cluster here: {WHY_NOT}")]


# A cluster per test, so that no test's Spark job waits on a core that an
# earlier test's executors may still hold (in the full suite such a job's
# ranks could fail to start at all); a fresh cluster costs about 15 s.
@pytest.fixture
def cluster():
    state = sparklab.up(NAME, 3, NET)
    try:
        yield state
    finally:
        sparklab.down(NAME)


def driver(cluster: dict, mode: str, ready_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(DRIVER), cluster["master"], cluster["lab"]["launcher"], "3", mode,
         str(ready_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, errors="replace",
        env=_child_env({"HVDKERAS_TEST_LEAN_IMPORTS": "0"}),  # Spark's transform needs pandas
        start_new_session=True)


def executors(out: str) -> list:
    match = re.search(r"^EXECUTORS (.*)$", out, re.M)
    assert match, tail(out)
    return match.group(1).split()


@pytest.mark.timeout(400)
def test_spark_run_puts_the_ranks_on_three_hosts(cluster, tmp_path):
    out = finish(driver(cluster, "run", tmp_path), 300)
    ranks = re.findall(r"RESULT rank (\d) host (\S+) sum 6\b", out)
    assert sorted(r for r, _ in ranks) == ["0", "1", "2"], tail(out)
    hosts = {h["host"] for h in cluster["lab"]["hosts"]}
    assert {host for _, host in ranks} == hosts, (ranks, hosts)
    assert len(executors(out)) == 3, tail(out)


@pytest.mark.timeout(500)
def test_keras_estimator_fits_across_three_hosts(cluster, tmp_path):
    out = finish(driver(cluster, "estimator", tmp_path), 420)
    match = re.search(r"RESULT accuracy ([\d.]+) rows 1797", out)
    assert match and float(match.group(1)) > 0.9, tail(out)
    assert executors(out) == sorted(h["address"] for h in cluster["lab"]["hosts"]), tail(out)


@pytest.mark.timeout(400)
def test_a_lost_worker_host_ends_the_run_naming_it(cluster, tmp_path):
    proc = driver(cluster, "lost", tmp_path)
    # A host that holds neither rank 0 nor the master.
    lose_a_rank_host(proc, tmp_path, NAME, cluster["lab"]["hosts"][0]["host"], LIVENESS_S,
                     "Spark worker")

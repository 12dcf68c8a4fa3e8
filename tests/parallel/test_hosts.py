"""Where the ranks run: local and cross ranks, and the allreduce path the
engine chose for that layout (Note [hierarchical allreduce] in
ops/core/allreduce_path.h).

On one host (tests/test_collectives_mpi.py) every rank is local. Under
tests/test_multihost_mpi.py the job runs on simulated hosts: MPICH's fork
launcher with a host list, which MPI treats as separate nodes.
`HVDKERAS_TEST_HOSTS` carries that list ("h0:2,h1:2") and
`HVDKERAS_HIERARCHICAL_ALLREDUCE` the path asked for; both are set by the
launching test, and the expected layout is computed here from them.
"""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import tensorflow as tf

import hvdkeras as hvd
from parallel_helpers import WORLD_RANK, WORLD_SIZE, assert_exact

HOSTS = os.environ.get("HVDKERAS_TEST_HOSTS", "")


def host_of_rank(spec: str, size: int) -> list:
    """Hydra's placement: hosts filled in list order, `slots` ranks each, and
    round again while ranks remain. "" is one host."""
    if not spec:
        return [0] * size
    slots = [int(entry.rpartition(":")[2] or 1) for entry in spec.split(",")]
    order = [host for host, n in enumerate(slots) for _ in range(n)]
    return [order[r % len(order)] for r in range(size)]


HOST = host_of_rank(HOSTS, WORLD_SIZE)
# Set by tests/test_netlab.py: the hosts are real (hosts of their own), so
# each rank's hostname is its host's name.
REAL_HOSTS = os.environ.get("HVDKERAS_TEST_REAL_HOSTS") == "1"


@pytest.mark.skipif(not REAL_HOSTS, reason="simulated hosts share this machine's name")
def test_each_rank_runs_on_its_host():
    names = [entry.rpartition(":")[0] for entry in HOSTS.split(",")]
    assert socket.gethostname() == names[HOST[WORLD_RANK]]
    # The ranks of one host are the ranks that share a hostname (MPI saw them
    # as one node because they are on one, not because a launcher said so).
    everyone = hvd.allgather_object(socket.gethostname(), name="hostnames")
    assert [everyone.index(n) for n in everyone] == [
        HOST.index(HOST[r]) for r in range(WORLD_SIZE)]


def test_local_and_cross_ranks_follow_the_hosts():
    me = HOST[WORLD_RANK]
    same_host = [r for r in range(WORLD_SIZE) if HOST[r] == me]
    local_rank = same_host.index(WORLD_RANK)
    peers = [r for r in range(WORLD_SIZE)
             if [q for q in range(WORLD_SIZE) if HOST[q] == HOST[r]].index(r) == local_rank]
    sizes = [HOST.count(h) for h in set(HOST)]
    assert (hvd.local_rank(), hvd.local_size()) == (local_rank, len(same_host))
    assert (hvd.cross_rank(), hvd.cross_size()) == (peers.index(WORLD_RANK), len(peers))
    assert hvd.is_homogeneous() == (len(set(sizes)) == 1)


def test_engine_reports_the_allreduce_path_of_this_layout():
    config = hvd.engine_config()
    hosts = len(set(HOST))
    several_on_a_host = max(HOST.count(h) for h in set(HOST)) > 1
    asked = os.environ.get("HVDKERAS_HIERARCHICAL_ALLREDUCE", "auto")
    if hosts == 1:
        hierarchical = False
    elif asked in ("1", "on"):
        hierarchical = True
    elif asked in ("0", "off"):
        hierarchical = False
    else:
        hierarchical = several_on_a_host
    assert config.hierarchical_allreduce == ("on" if hierarchical else "off")
    assert config.shm_allreduce == (hierarchical or (hosts == 1 and WORLD_SIZE > 1))


@pytest.mark.parametrize("dtype", [tf.float32, tf.float16, tf.int32, tf.float64])
@pytest.mark.parametrize("elements", [100_001, 1_500_003], ids=["400KB", "6MB"])
def test_large_allreduce_sums_every_hosts_contribution(elements, dtype):
    """Sizes past the shared-memory threshold, odd so that slices are uneven."""
    def contribution(rank):
        return (np.arange(elements) * (rank + 3)) % 11 - rank

    got = hvd.allreduce(tf.constant(contribution(WORLD_RANK), dtype), op=hvd.Sum,
                        name=f"hosts {elements} {dtype.name}")
    want = sum(contribution(r) for r in range(WORLD_SIZE))
    assert_exact(got, want.astype(dtype.as_numpy_dtype), f"sum of {elements}")
    average = hvd.allreduce(tf.constant(contribution(WORLD_RANK), tf.float64), op=hvd.Average,
                            name=f"hosts average {elements} {dtype.name}")
    assert_exact(average, want / WORLD_SIZE, "average")

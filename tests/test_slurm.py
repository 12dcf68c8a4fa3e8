"""Slurm allocations: host lists and task counts in the formats Slurm writes
(pure, hvdkeras.runner.slurm), and an `hvdkerasrun` without -H or -np driven by
those variables. No Slurm is installed here: the variables stand in for an
allocation of this machine, and Hydra is told to start ranks locally
(`-launcher fork`; in a real allocation it uses srun)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from hvdkeras.runner import slurm
from hvdkeras.runner.hosts import HostSlots
from mpi_runner import describe, run_command

TESTS = Path(__file__).resolve().parent
HVDKERASRUN = Path(sys.executable).parent / "hvdkerasrun"
TIMEOUT = 240


@pytest.mark.parametrize("text, expected", [
    ("node01", ["node01"]),
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("a[1-2],b,c[9-10]", ["a1", "a2", "b", "c9", "c10"]),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("n[008-010]", ["n008", "n009", "n010"]),
])
def test_nodelists_expand_in_slurms_order(text, expected):
    assert slurm.expand_nodelist(text) == expected


@pytest.mark.parametrize("text", ["n[1-", "n]1[", "n[a-b]", "n[3-1]", ""])
def test_bad_nodelists_name_the_variable(text):
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        slurm.expand_nodelist(text)


@pytest.mark.parametrize("text, expected", [
    ("2", [2]), ("2(x3)", [2, 2, 2]), ("4(x2),1,3(x1)", [4, 4, 1, 3]),
])
def test_tasks_per_node(text, expected):
    assert slurm.expand_tasks_per_node(text) == expected


def test_bad_tasks_per_node_name_the_variable():
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        slurm.expand_tasks_per_node("2(3)")


def test_allocation_hosts_and_np():
    env = {"SLURM_JOB_ID": "41", "SLURM_JOB_NODELIST": "cn[1-3]",
           "SLURM_TASKS_PER_NODE": "2(x2),1", "SLURM_NTASKS": "5"}
    assert slurm.allocation_hosts(env) == [HostSlots("cn1", 2), HostSlots("cn2", 2),
                                           HostSlots("cn3", 1)]
    assert slurm.allocation_np(env) == 5
    del env["SLURM_NTASKS"]
    assert slurm.allocation_np(env) == 5  # the slots' total
    assert slurm.allocation_hosts({}) is None and slurm.allocation_np({}) is None


def test_node_and_task_counts_must_agree():
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "cn[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    with pytest.raises(ValueError, match="gives 2 nodes but.*names 3"):
        slurm.allocation_hosts(env)


def _slurm_env(**extra):
    env = dict(os.environ, SLURM_JOB_ID="1234", SLURM_JOB_NODELIST="localhost",
               SLURM_TASKS_PER_NODE="2", SLURM_NTASKS="2")
    env.update(extra)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


@pytest.mark.timeout(TIMEOUT + 60)
def test_hvdkerasrun_takes_hosts_and_ranks_from_the_allocation():
    result = run_command([str(HVDKERASRUN), "--mpi-args", "-launcher fork", sys.executable,
                          str(TESTS / "launcher_scripts" / "whoami.py")],
                         timeout=TIMEOUT, env=_slurm_env())
    assert result.returncode == 0, describe(result)
    assert "hosts from the Slurm allocation: localhost:2" in result.stdout, \
        describe(result)
    for rank in (0, 1):
        assert re.search(rf"^\[{rank}\]<stdout>: WHOAMI {rank} of 2", result.stdout, re.M), \
            describe(result)


@pytest.mark.timeout(TIMEOUT + 60)
def test_hvdkerasrun_refuses_a_bad_allocation_before_starting_anything():
    result = run_command([str(HVDKERASRUN), sys.executable, "-c", "print('STARTED')"],
                         timeout=TIMEOUT, env=_slurm_env(SLURM_TASKS_PER_NODE="2(y1)"))
    assert result.returncode == 2, describe(result)
    assert "SLURM_TASKS_PER_NODE" in result.stdout and "STARTED" not in result.stdout, \
        describe(result)

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


def test_inside_an_allocation_ranks_start_through_slurm():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "2"}
    hosts, np, through = slurm.allocation_launch(env, None, None, None, "ssh")
    assert (hosts, np, through) == ([HostSlots("n1", 1), HostSlots("n2", 1)], 2, True)
    # Hosts the user names, or an ssh command they chose, keep ssh.
    assert slurm.allocation_launch(env, "a:1,b:1", None, 2, "ssh") == (None, 2, False)
    assert slurm.allocation_launch(env, None, None, None, "my-ssh")[2] is False
    assert slurm.allocation_launch({}, None, None, None, "ssh") == (None, None, False)


def test_hvdkeras_train_reads_the_allocation_only_for_several_ranks():
    from types import SimpleNamespace

    def args(**given):
        return SimpleNamespace(**{"engine": "mpi", "hosts": None, "hostfile": None, "np": None,
                                  "ssh_command": "ssh", **given})

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "2"}
    assert slurm.train_launch(env, args()) == ("n1:1,n2:1", 2, True)
    assert slurm.train_launch({}, args()) == (None, 1, False)  # one rank, in this process
    assert slurm.train_launch({**env, "SLURM_NTASKS": "1",
                               "SLURM_JOB_NODELIST": "n1"}, args()) == (None, 1, False)
    assert slurm.train_launch(env, args(engine="ray", np=3)) == (None, 3, False)


def test_ranks_that_srun_starts_use_libfabric():
    """Note [ranks started by srun] in hvdkeras/engine/config.py."""
    from hvdkeras.engine.config import transport_defaults

    srun = {"SLURM_MPI_TYPE": "pmi2", "PMI_FD": "11"}
    assert transport_defaults(srun) == {"UCX_RNDV_THRESH": "2mb", "MPIR_CVAR_CH4_NETMOD": "ofi",
                                        "FI_PROVIDER": "tcp"}
    assert "MPIR_CVAR_CH4_NETMOD" not in transport_defaults({"PMI_FD": "11"})  # Hydra's ranks
    chosen = transport_defaults({**srun, "MPIR_CVAR_CH4_NETMOD": "ucx"})
    assert "FI_PROVIDER" not in chosen and "MPIR_CVAR_CH4_NETMOD" not in chosen


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


def test_sinfo_output_names_the_lost_nodes():
    from hvdkeras.runner.slurm_nodes import NodeTrouble, troubled_nodes

    text = ("h0|allocated|none\nh1|mixed|none\nh2|down*|Not responding\n"
            "h3|idle*|none\nh4|drained|maintenance\nh2|down*|Not responding\n")
    assert troubled_nodes(text) == [NodeTrouble("h2", "down*", "Not responding"),
                                    NodeTrouble("h3", "idle*", ""),
                                    NodeTrouble("h4", "drained", "maintenance")]
    assert troubled_nodes("h0|allocated|none\nh1|completing|none\n") == []


def test_node_trouble_asks_sinfo_about_the_allocation_only():
    import subprocess

    from hvdkeras.runner.slurm_nodes import node_trouble

    asked = []

    def sinfo(args, **kwargs):
        asked.append(args)
        return subprocess.CompletedProcess(args, 0, "n1|allocated|none\nn2|down*|Not responding\n",
                                           "")

    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    said = node_trouble(env, run=sinfo)
    assert "n2 (down*: Not responding)" in said and "n1" not in said
    assert asked == [["sinfo", "-h", "-N", "-n", "n1,n2", "-o", "%N|%T|%E"]]
    assert node_trouble({}, run=sinfo) is None  # not in an allocation: nothing asked
    assert len(asked) == 1

    def hung(args, **kwargs):
        raise subprocess.TimeoutExpired(args, kwargs["timeout"])

    assert node_trouble(env, run=hung) is None

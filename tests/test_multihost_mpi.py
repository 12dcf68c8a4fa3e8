"""The collective suite and the model.fit equivalence tests on several hosts,
simulated on this machine, with the hierarchical allreduce on and off.

Each job starts its ranks with MPICH's fork launcher and a host list
(`simulated_hosts_args` in mpi_runner.py): MPI treats each named host as a
node of its own, so local and cross ranks, the shared-memory domains and the
engine's choice of allreduce path are what they would be on that many
machines (tests/parallel/test_hosts.py checks them against the list). Every
layout runs with `HVDKERAS_HIERARCHICAL_ALLREDUCE=1` (shared memory within a
host, MPI across: Note [hierarchical allreduce] in ops/core/allreduce_path.h)
and `=0` (one MPI allreduce over all ranks); every test checks exact values
against what each rank contributed, or compares with one process on the
global batch, so both paths must give those results.

One pytest session per job covers all of tests/parallel/ (the per-file
sessions of test_collectives_mpi.py would cost a start-up per file and
layout); a failure still names its test in the output.

By default the suite runs once, on the layout that is hardest for the
hierarchical path (2+1+1: uneven hosts, a host's ranks not consecutive),
with that path, over the files whose code depends on which ranks share a
host (`SUITE_FILES`), and the equivalence runs on 2x2 hierarchical and
2+1+1 flat;
the flat path's MPI allreduce is the one the single-host sessions run with
shared memory off (test_collectives_mpi.py), and tests/test_netlab.py runs
the allreduce files on 2x2 real hosts. HVDKERAS_MULTIHOST_FULL=1 runs the
whole suite and the equivalence on both layouts and both paths.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpi_runner import assert_every_rank_passed, run_pytest_under_mpi

TESTS = Path(__file__).resolve().parent
# name -> (ranks, Hydra host list). Ranks fill each host's slots in list
# order, then go round again: "3hosts" puts ranks 0 and 3 on h0, so its
# hosts differ in size and a host's ranks are not consecutive.
LAYOUTS = {
    "2hosts-2x2": (4, "h0:2,h1:2"),
    "3hosts-2+1+1": (4, "h0:1,h1:1,h2:1"),
}
PATHS = {"hierarchical": "1", "flat": "0"}
# Backstops against hangs: the suite takes about 75 s with 4 ranks on an idle
# 2-core machine; a stalled collective fails after STALL_SHUTDOWN_S.
SUITE_TIMEOUT_S = 600
FIT_TIMEOUT_S = 300
STALL_SHUTDOWN_S = 30

pytestmark = pytest.mark.usefixtures("op_library_built")

FULL = os.environ.get("HVDKERAS_MULTIHOST_FULL") == "1"
# (layout, path) pairs of the default run: the suite's, then the fit's.
SUITE_DEFAULT = {("3hosts-2+1+1", "hierarchical")}
# The suite's files of the default run: those whose code paths depend on which
# ranks share a host (allreduce paths, shared-memory domains, local and cross
# ranks, sets spanning hosts). The rest run at 1, 2, 3 and 8 ranks on one
# host (test_collectives_mpi.py, test_many_ranks.py), and here with FULL.
SUITE_FILES = ("test_allreduce.py", "test_allreduce_large.py", "test_hosts.py",
               "test_world.py", "test_broadcast.py", "test_gather_scatter.py",
               "test_process_sets.py", "test_adasum.py")
# The fit's default: the hierarchical way. The flat way across hosts trains
# in tests/test_netlab.py's fit on 3 lab hosts of one rank each (where `auto`
# is flat), and here with FULL (about 50 s here).
FIT_DEFAULT = {("2hosts-2x2", "hierarchical")}


def cases(default: set) -> list:
    return [pytest.param(layout, path, id=f"{layout}-{path}")
            for layout in LAYOUTS for path in PATHS if FULL or (layout, path) in default]


def _env(path: str) -> dict:
    # Each large product of cases pairwise (Note [pairwise cases] in
    # tests/parallel/conftest.py); every case with FULL.
    return {"HVDKERAS_HIERARCHICAL_ALLREDUCE": PATHS[path],
            "HVDKERAS_STALL_SHUTDOWN_SECONDS": str(STALL_SHUTDOWN_S),
            "HVDKERAS_PAIRWISE_CASES": "0" if FULL else "1"}


@pytest.mark.slow
@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
@pytest.mark.parametrize("layout, path", cases(SUITE_DEFAULT))
def test_collective_suite_on_simulated_hosts(layout, path):
    np, hosts = LAYOUTS[layout]
    assert all((TESTS / "parallel" / f).exists() for f in SUITE_FILES), SUITE_FILES
    files = [TESTS / "parallel"] if FULL else [TESTS / "parallel" / f for f in SUITE_FILES]
    result, reports = run_pytest_under_mpi(np, files[0], timeout=SUITE_TIMEOUT_S,
                                           env=_env(path), hosts=hosts,
                                           extra_args=[str(f) for f in files[1:]])
    assert_every_rank_passed(np, result, reports)


@pytest.mark.slow
# The hierarchical allreduce's exact results are checked by the suite above;
# this trains through it (pyproject.toml's `extended`).
@pytest.mark.extended
@pytest.mark.timeout(FIT_TIMEOUT_S + 60)
@pytest.mark.parametrize("layout, path", cases(FIT_DEFAULT))
def test_fit_matches_one_process_on_simulated_hosts(layout, path):
    np, hosts = LAYOUTS[layout]
    result, reports = run_pytest_under_mpi(
        np, TESTS / "keras_parallel" / "test_equivalence.py", timeout=FIT_TIMEOUT_S,
        env=_env(path), hosts=hosts, extra_args=["-rfE", "-W", "ignore::DeprecationWarning"])
    assert_every_rank_passed(np, result, reports)

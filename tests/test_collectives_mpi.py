"""Runs tests/parallel/ under mpiexec with 1, 2 and 3 ranks.

By default one pytest session per rank count covers every file (a start-up
per file and rank count would cost minutes); HVDKERAS_PARALLEL_PER_FILE=1
runs one session per file instead, so a failure in one file leaves the
others running (what to use when hunting a failure).
Every rank runs the same pytest session (so collectives line up across
ranks) and reports its outcome in a file of its own (see Note [one file per
rank] in mpi_runner.py); each session runs with -x: a rank whose test fails
exits, its shutdown stops the engine on the other ranks (their collectives
then fail), and mpiexec ends the job.
After every test the ranks meet in a collective named after it
(tests/parallel/conftest.py); a collective that some rank never submits is
ended after STALL_SHUTDOWN_S by the engine's stall check, with a message
naming the missing ranks. The subprocess timeout is only the last backstop
against hangs; it kills the whole process group.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpi_runner import assert_every_rank_passed, run_pytest_under_mpi

PARALLEL_DIR = Path(__file__).resolve().parent / "parallel"
PARALLEL_FILES = sorted(p.name for p in PARALLEL_DIR.glob("test_*.py"))
RANKS = (1, 2, 3)
# One rank keeps one core busy (the `light` marker: pyproject.toml).
RANKS_PARAMS = [pytest.param(n, marks=pytest.mark.light) if n == 1 else n for n in RANKS]
# Backstop against hangs, per job. test_stress.py retraces a 200-op function
# step after step on every rank (its N_STEPS says how long that takes), and
# a shared machine can triple that, hence its larger limit.
JOB_TIMEOUT_S = 240
JOB_TIMEOUTS_S = {"test_stress.py": 420}
PER_FILE = os.environ.get("HVDKERAS_PARALLEL_PER_FILE") == "1"
# One session over every file: about 2 minutes with 3 ranks here.
SUITE_TIMEOUT_S = 1500
TARGETS = PARALLEL_FILES if PER_FILE else ["."]
# A collective some rank never submits fails after this long (naming the
# missing ranks) instead of hanging until the job timeout.
STALL_SHUTDOWN_S = 30



pytestmark = pytest.mark.usefixtures("op_library_built")


def test_parallel_files_found():
    """Guards against the parametrization below silently becoming empty."""
    assert {"test_allreduce.py", "test_broadcast.py", "test_errors.py",
            "test_gradients.py", "test_stress.py"} <= set(PARALLEL_FILES)


@pytest.mark.slow
@pytest.mark.timeout(SUITE_TIMEOUT_S + 60)
@pytest.mark.parametrize("test_file", TARGETS, ids=lambda f: "all" if f == "." else f)
@pytest.mark.parametrize("np", RANKS_PARAMS, ids=lambda n: f"np{n}")
def test_parallel_file(np, test_file):
    """tests/parallel/<test_file> (all of it: ".") passes on every rank of an np-rank job."""
    timeout = (SUITE_TIMEOUT_S if test_file == "."
               else JOB_TIMEOUTS_S.get(test_file, JOB_TIMEOUT_S))
    result, reports = run_pytest_under_mpi(
        np, (PARALLEL_DIR / test_file).resolve(), timeout=timeout,
        env={"HVDKERAS_STALL_SHUTDOWN_SECONDS": str(STALL_SHUTDOWN_S)})
    assert_every_rank_passed(np, result, reports)


# The big-buffer tests again on the other paths: MPI pieces (the shared-memory
# allreduce off), the shared-memory staging area alone (no results in shared
# memory), and a 1 MiB shared-memory region that some results fit and others
# do not (see Note [shared outputs] in ops/core/shm_arena.h).
LARGE_VARIANTS = {
    "mpi": {"HVDKERAS_SHM_ALLREDUCE": "0"},
    "shm-staging": {"HVDKERAS_SHM_ARENA_BYTES": "0"},
    "shm-small-arena": {"HVDKERAS_SHM_ARENA_BYTES": str(1 << 20)},
}
# Every path at 2 ranks; at 3 only the small region, whose bookkeeping
# depends on the ranks (which results fit). The MPI pieces also run across
# hosts in tests/test_multihost_mpi.py (4 ranks), and the staging area is the
# default path's reduction without its region; the two cost about 40 s at 3
# ranks here. HVDKERAS_LARGE_PATHS_EVERY_SIZE=1 runs every path at 3 ranks.
LARGE_EVERY_SIZE = os.environ.get("HVDKERAS_LARGE_PATHS_EVERY_SIZE") == "1"
# The shared-memory variants at 2 ranks are `extended` (pyproject.toml):
# their 3-rank form and the MPI pieces at 2 ranks run in every CI run.
LARGE_CASES = [pytest.param(n, v, id=f"np{n}-{v}",
                            marks=[pytest.mark.extended] if n == 2 and v != "mpi" else [])
               for n in (2, 3) for v in sorted(LARGE_VARIANTS)
               if n == 2 or v == "shm-small-arena" or LARGE_EVERY_SIZE]


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
@pytest.mark.parametrize("np, variant", LARGE_CASES)
def test_large_allreduce_other_paths(np, variant):
    """The big-buffer tests on the engine's other allreduce paths."""
    result, reports = run_pytest_under_mpi(
        np, PARALLEL_DIR / "test_allreduce_large.py", timeout=JOB_TIMEOUT_S,
        env={**LARGE_VARIANTS[variant],
             "HVDKERAS_STALL_SHUTDOWN_SECONDS": str(STALL_SHUTDOWN_S)})
    assert_every_rank_passed(np, result, reports)


# The ring (Note [ring across hosts] in ops/core/ring_plan.h) runs across
# hosts; HVDKERAS_RING_COLLECTIVES=1 makes it take every reducible
# allreduce, reduce-scatter and allgather of any size on one host too, so
# its schedule meets every dtype, op, odd size, fused buffer and process set
# of these files here, at a rank count MPI's own algorithms treat unevenly.
# tests/test_netlab.py runs the same files across 3 and 4 hosts of their own.
RING_FILES = ("test_allreduce.py", "test_gather_scatter.py", "test_process_sets.py",
              "test_allreduce_large.py")


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_ring_collectives_on_every_size():
    result, reports = run_pytest_under_mpi(
        3, [PARALLEL_DIR / name for name in RING_FILES], timeout=JOB_TIMEOUT_S,
        env={"HVDKERAS_RING_COLLECTIVES": "1", "HVDKERAS_SHM_ALLREDUCE": "0",
             "HVDKERAS_STALL_SHUTDOWN_SECONDS": str(STALL_SHUTDOWN_S)})
    assert_every_rank_passed(3, result, reports)

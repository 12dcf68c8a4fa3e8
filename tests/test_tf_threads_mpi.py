"""hvdkeras.init() shares a host's cores between its ranks' TensorFlow pools.

Real `mpiexec` jobs of tests/scripts/tf_threads_job.py. The ranks all run on
this machine's cores, so with N ranks each pool gets cores // N threads (at
least 1), and idle pool threads do not spin, unless the user chose otherwise.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mpi_runner import describe, run_python, run_under_mpi

SCRIPT = Path(__file__).resolve().parent / "scripts" / "tf_threads_job.py"
JOB_TIMEOUT_S = 240
CPUS = len(os.sched_getaffinity(0))

pytestmark = [pytest.mark.usefixtures("op_library_built"),
              pytest.mark.slow, pytest.mark.timeout(JOB_TIMEOUT_S + 60)]



def run_job(np: int, args: list[str] = (), env: dict | None = None,
            expect_ok: bool = True) -> list[dict]:
    """Every rank's RESULT record, in rank order."""
    env = {"HVDKERAS_TF_THREADS": "", "TF_NUM_INTRAOP_THREADS": "",
           "TF_NUM_INTEROP_THREADS": "", **(env or {})}
    if np == 0:
        result = run_python([str(SCRIPT), *args], timeout=JOB_TIMEOUT_S, env=env)
        np = 1
    else:
        result = run_under_mpi(np, [str(SCRIPT), *args], timeout=JOB_TIMEOUT_S, env=env)
    if expect_ok:
        assert result.returncode == 0, describe(result)
    outputs = result.ranks if hasattr(result, "ranks") else [result]  # one output per rank
    records = [json.loads(line[len("RESULT "):]) for out in outputs
               for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert sorted(r["rank"] for r in records) == list(range(np)), describe(result)
    return sorted(records, key=lambda r: r["rank"])


@pytest.mark.parametrize("np", [2, 3])
def test_ranks_on_one_host_split_its_cores(np):
    expected = max(1, CPUS // np)
    for record in run_job(np):
        assert (record["intra"], record["inter"]) == (expected, expected), record
        assert record["no_spinning"] is True, record
        assert record["warnings"] == [], record
        assert record["allreduce"] == [np * (np + 1) / 2] * 3, record


def test_a_plain_script_keeps_tensorflow_defaults():
    """A world of one competes with nobody: TensorFlow sizes its pools itself (0 = default)."""
    (record,) = run_job(0)
    assert (record["intra"], record["inter"]) == (0, 0), record
    assert record["no_spinning"] is False, record
    assert record["allreduce"] == [1.0] * 3


def test_explicit_thread_count_applies_to_both_pools():
    for record in run_job(2, env={"HVDKERAS_TF_THREADS": "3"}):
        assert (record["intra"], record["inter"]) == (3, 3), record
        assert record["no_spinning"] is True, record  # the two ranks share this host's cores
        assert record["allreduce"] == [3.0] * 3


@pytest.mark.parametrize("env", [{"HVDKERAS_TF_THREADS": "off"},
                                 {"TF_NUM_INTRAOP_THREADS": "2"},
                                 {"TF_NUM_INTEROP_THREADS": "2"}])
def test_user_choices_are_left_alone(env):
    for record in run_job(2, env=env):
        assert (record["intra"], record["inter"]) == (0, 0), record
        assert record["no_spinning"] is False, record
        assert record["warnings"] == [], record
        assert record["allreduce"] == [3.0] * 3


def test_tensorflow_started_before_init_warns_on_rank_0_only():
    records = run_job(2, ["early"])
    for record in records:
        assert (record["intra"], record["inter"]) == (0, 0), record
        assert record["no_spinning"] is False, record
        assert record["allreduce"] == [3.0] * 3, record
    (warning,) = records[0]["warnings"]
    assert "before running any TensorFlow op" in warning and "HVDKERAS_TF_THREADS=0" in warning
    assert records[1]["warnings"] == []


def test_bad_value_fails_init_on_every_rank():
    for record in run_job(2, env={"HVDKERAS_TF_THREADS": "many"}):
        assert "HVDKERAS_TF_THREADS='many' is not valid" in record["error"], record
        assert (record["intra"], record["inter"]) == (0, 0), record

"""The stall inspector: warnings and shutdown when a rank withholds a collective.

Launches 3-rank jobs of tests/scripts/stall_job.py, where rank 1 withholds a
named allreduce that ranks 0 and 2 have submitted, once for a name never used
before and once for a name already in the response cache (the engine must
move such a long-waiting cached op to the coordinator to see who is missing).

* HVDKERAS_STALL_CHECK_SECONDS=2: rank 0's stderr names the tensor and the
  missing rank, reporting a wait of at least 2 s and at most 2 s + slack,
  and the warning is already there at that deadline (checked from inside the
  job); once rank 1 submits, the op completes.
* HVDKERAS_STALL_SHUTDOWN_SECONDS=4: ranks 0 and 2 get an error naming the
  tensor and the missing rank after about 4 s, the world keeps working, and
  the job ends well before the subprocess timeout.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from mpi_runner import describe, run_under_mpi

SCRIPT = Path(__file__).resolve().parent / "scripts" / "stall_job.py"
JOB_TIMEOUT_S = 240
RANKS = 3
CHECK_S = 2.0
SHUTDOWN_S = 4.0
SLACK_S = 2.5  # scheduling slack on a loaded 2-core machine running 3 ranks

pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.light,
              pytest.mark.slow, pytest.mark.timeout(JOB_TIMEOUT_S + 60)]



def run_job(mode: str, tmp_path: Path, env: dict) -> tuple[list[dict], dict, float]:
    """Runs the job; returns (REPORT records, {rank: stderr text}, wall seconds)."""
    start = time.monotonic()
    result = run_under_mpi(RANKS, [str(SCRIPT), mode, str(tmp_path)], timeout=JOB_TIMEOUT_S,
                           env={"STALL_TEST_SLACK_SECONDS": str(SLACK_S), **env})
    elapsed = time.monotonic() - start
    stderr = {r: (tmp_path / f"rank{r}.err").read_text(errors="replace") for r in range(RANKS)}
    context = describe(result) + "".join(
        f"\n--- rank {r} stderr ---\n{text[-3000:]}" for r, text in stderr.items())
    assert result.returncode == 0, context
    reports = [json.loads(line) for r in range(RANKS)
               for line in (tmp_path / f"rank{r}.jsonl").read_text().splitlines()]
    assert sum(1 for r in reports if r.get("done")) == RANKS, context
    return reports, stderr, elapsed


def find(reports, **match) -> list[dict]:
    return [r for r in reports if all(r.get(k) == v for k, v in match.items())]


WARNING = re.compile(
    r"hvdkeras: WARNING: collective '(?P<name>[^']+)' has waited (?P<seconds>[0-9.]+) s: "
    r"rank\(s\) (?P<missing>[0-9, ]+) have not submitted it \(rank\(s\) (?P<submitted>[0-9, ]+) "
    r"have\)")


def test_stall_warning_names_tensor_and_missing_rank(tmp_path):
    reports, stderr, elapsed = run_job("warn", tmp_path,
                                       {"HVDKERAS_STALL_CHECK_SECONDS": str(CHECK_S)})
    warnings = [m.groupdict() for m in WARNING.finditer(stderr[0])]
    for name in ("fresh_tensor", "cached_tensor"):
        mine = [w for w in warnings if w["name"] == name]
        assert len(mine) == 1, f"{name}: expected one warning on rank 0, got {mine}\n{stderr[0]}"
        w = mine[0]
        assert w["missing"] == "1" and w["submitted"] == "0, 2", w
        assert CHECK_S <= float(w["seconds"]) <= CHECK_S + SLACK_S, w
        # Checked inside the job on rank 0, CHECK_S + SLACK_S after it submitted.
        assert find(reports, phase=name, warned_by_deadline=True), (name, reports)
        assert len(find(reports, phase=name, completed=True)) == RANKS, (name, reports)
    # Only rank 0 inspects stalls.
    for r in (1, 2):
        assert "has waited" not in stderr[r], stderr[r]
    assert elapsed < JOB_TIMEOUT_S / 2, elapsed


def test_stall_shutdown_fails_the_op_on_every_submitting_rank(tmp_path):
    reports, stderr, elapsed = run_job("shutdown", tmp_path, {
        "HVDKERAS_STALL_CHECK_SECONDS": str(CHECK_S),
        "HVDKERAS_STALL_SHUTDOWN_SECONDS": str(SHUTDOWN_S),
    })
    for name in ("fresh_withheld", "cached_withheld"):
        for rank in (0, 2):
            (got,) = find(reports, phase=name, rank=rank)[:1] or [None]
            assert got is not None and got.get("error") == "FailedPreconditionError", (
                name, rank, reports)
            assert f"Collective '{name}' stalled for " in got["message"], got
            assert ("rank(s) 1 never submitted it (rank(s) 0, 2 did), so it was ended by "
                    "HVDKERAS_STALL_SHUTDOWN_SECONDS") in got["message"], got
            assert SHUTDOWN_S <= got["seconds"] <= SHUTDOWN_S + SLACK_S, got
        assert len(find(reports, phase=name, after_ok=True)) == RANKS, (name, reports)
        # The warning came first, at the check interval.
        assert f"collective '{name}' has waited" in stderr[0], stderr[0]
    assert elapsed < JOB_TIMEOUT_S / 2, elapsed


RACE_SCRIPT = Path(__file__).resolve().parent / "scripts" / "stall_race_job.py"
RACE_BOUND_S = 2.0


def test_a_collective_arriving_as_its_stall_ends_leaves_nothing_behind():
    """Note [stall shutdown after the cycle's requests]: rank 1 submits 160
    names spread over the moment rank 0's copies stall out, then rank 0 at
    once submits them again alone. Before the note, a name whose request came
    in the failure cycle stayed in the coordinator and rank 0 then ran it
    alone (4 of 5 runs here hung or aborted with MPI's "Message truncated").

    Rank 1's submissions are timed against a clock, so how many land in the
    failure cycle itself varies from run to run (on a loaded machine often
    none: they pair with rank 0's first round or, arriving later, with its
    second). What holds in every run: the job ends cleanly, each of rank 1's
    names either ran or ended with a stall error, rank 0's second round
    completes only if every one of rank 1's names went with it, and a name
    that hit the failure cycle makes the second round stall naming rank 1."""
    result = run_under_mpi(2, [str(RACE_SCRIPT), str(RACE_BOUND_S)], timeout=120,
                           env={"HVDKERAS_STALL_SHUTDOWN_SECONDS": str(RACE_BOUND_S)})
    assert result.returncode == 0, describe(result)
    assert "Fatal error" not in result.stdout and "hvdkeras: ERROR" not in result.stdout, (
        describe(result))
    found = [re.search(r"^RESULT (.*)$", result.ranks[r].stdout, re.M) for r in (0, 1)]
    assert all(found), describe(result)
    rank0, rank1 = (json.loads(m.group(1)) for m in found)
    print(f"{rank1['in_failure_cycle']} of rank 1's names arrived in the failure cycle; "
          f"rank 0's second round: {rank0['second'][:60]!r}")
    assert all(o == "ok" or "stalled for" in o for o in rank1["first"]), rank1
    if rank0["second"] == "ok":
        assert all(o == "ok" for o in rank1["first"]), (rank0, rank1)
    else:
        assert "stalled for" in rank0["second"], rank0
        assert "rank(s) 1 never submitted it" in rank0["second"], rank0
        assert rank0["second_seconds"] <= RACE_BOUND_S + SLACK_S, rank0
    if rank1["in_failure_cycle"]:
        assert rank0["second"] != "ok", (rank0, rank1)

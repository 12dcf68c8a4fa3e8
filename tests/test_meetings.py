"""Python's own agreements between ranks, and join(), are bounded.

The messages are pure functions, tested first; then real 3-rank jobs
(tests/scripts/meeting_job.py) where a rank never arrives in init() or
add_process_set(), or the ranks make different set-up calls. The ranks
that wait must raise within the stall bound (plus start-up slack), naming
the ranks that did and did not arrive and, once the engine runs, what the
missing rank says it is doing; ranks in different calls fail at once. A
join() whose missing rank runs nothing fails the same way
(hvdkeras/engine/agreement.py; Note [bounded waits] in ops/core/watchdog.h).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hvdkeras.engine import agreement
from mpi_runner import describe, run_under_mpi

# The ranks mostly wait out the bound (the `light` marker: pyproject.toml).
pytestmark = pytest.mark.light

SCRIPT = Path(__file__).resolve().parent / "scripts" / "meeting_job.py"
BOUND_S = 4.0
SLACK_S = 6.0  # a loaded 2-core machine running 3 ranks
ABSENT_S = 2 * BOUND_S + SLACK_S  # how long the missing rank stays away


def test_the_messages_name_the_ranks():
    assert agreement.describe_ranks([0, 2]) == "0, 2"
    # The same words as the C++ core's RankListText (ops/tests/test_common.cc).
    assert agreement.describe_ranks([0, 2, 5, 6, 7, 8, 9]) == "0, 2, 5-9"
    assert agreement.describe_ranks([1, 2, 3, 7, 8]) == "1-3, 7, 8"
    assert agreement.describe_ranks(list(range(16384))) == "0-16383"
    assert agreement.describe_ranks(list(range(0, 100, 2)), 3) == "0, 2, 4 and 47 more"
    text = agreement.diverged_message("hvdkeras.add_process_set()", 0,
                                      {1: "hvdkeras.remove_process_set()"})
    assert text.startswith("hvdkeras: rank 0 is in hvdkeras.add_process_set(), but rank 1 is "
                           "in hvdkeras.remove_process_set().")
    assert "the program diverged" in text
    text = agreement.timeout_message("hvdkeras.init()", 0, 4.2, [0, 1], [2],
                                     {2: "main thread in its own code"})
    assert text.splitlines() == [
        "hvdkeras: rank 0 waited 4.2 s in hvdkeras.init() for rank(s) 2, which never arrived "
        "(rank(s) 0, 1 did). Every rank must make this call; the wait is bounded by "
        "HVDKERAS_STALL_SHUTDOWN_SECONDS.",
        "  rank 2 says: main thread in its own code"]


def test_one_rank_meets_alone():
    class Alone:
        def Get_rank(self):
            return 0

        def Get_size(self):
            return 1

    assert agreement.meet(Alone(), "x", 7) == [7]


def run(mode: str) -> dict:
    result = run_under_mpi(3, [str(SCRIPT), mode, str(ABSENT_S)], timeout=240,
                           env={"HVDKERAS_STALL_SHUTDOWN_SECONDS": str(BOUND_S)})
    assert result.returncode == 0, describe(result)
    found = {}
    for r, out in enumerate(result.ranks):
        line = re.search(r"^RESULT (.*)$", out.stdout, re.M)
        assert line, describe(result)
        found[r] = json.loads(line.group(1))
    return found




@pytest.mark.usefixtures("op_library_built")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_never_calls_init():
    results = run("skip_init")
    for r in (0, 1):
        error = results[r].get("error", "")
        assert results[r].get("type") == "MeetingError", results
        assert re.search(rf"rank {r} waited [\d.]+ s in hvdkeras.init\(\) for rank\(s\) 2, which "
                         r"never arrived \(rank\(s\) 0, 1 did\)", error), results
        assert BOUND_S <= results[r]["seconds"] <= BOUND_S + SLACK_S + 60, results  # + startup


@pytest.mark.usefixtures("op_library_built")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_rank_that_never_adds_the_process_set():
    results = run("skip_add")
    for r in (0, 1):
        error = results[r].get("error", "")
        assert re.search(rf"rank {r} waited [\d.]+ s in hvdkeras.add_process_set\(\) for "
                         r"rank\(s\) 2, which never arrived \(rank\(s\) 0, 1 did\)", error), results
        # What the missing rank's watchdog says: it runs its own code.
        assert re.search(r"rank 2 says: pid \d+ on \S+: main thread in its own code", error), results
        assert BOUND_S <= results[r]["seconds"] <= BOUND_S + SLACK_S, results
    assert "error" not in results[2], results


@pytest.mark.usefixtures("op_library_built")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ranks_in_different_calls_fail_at_once():
    results = run("different")
    for r in range(3):
        assert "the program diverged" in results[r].get("error", ""), results
        assert results[r]["seconds"] < SLACK_S, results
    # Rank 0 names whichever of the others it heard from first.
    assert re.search(r"rank 0 is in hvdkeras.add_process_set\(\), but rank [12] is in "
                     r"hvdkeras.remove_process_set\(\)", results[0]["error"]), results
    assert re.search(r"rank 1 is in hvdkeras.remove_process_set\(\), but rank 0 is in "
                     r"hvdkeras.add_process_set\(\)", results[1]["error"]), results


@pytest.mark.usefixtures("op_library_built")
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_join_whose_missing_rank_went_quiet():
    results = run("no_join")
    for r in (0, 1):
        error = results[r].get("error", "")
        assert re.search(r"join\(\) waited [\d.]+ s for rank\(s\) 2, which neither joined nor "
                         r"submitted any collective for twice the bound \(rank\(s\) 0, 1 joined\)",
                         error), results
        assert 2 * BOUND_S <= results[r]["seconds"] <= 2 * BOUND_S + SLACK_S, results

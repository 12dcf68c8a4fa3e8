"""The allreduce benchmark script runs and prints its whole table.

Timing is the script's business, not the tests': this only checks that
`examples/allreduce_benchmark.py` still works end to end under 2 ranks (a
short run: one size, few iterations, one pass), in both shapes of its cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mpi_runner import describe, run_under_mpi

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "allreduce_benchmark.py"
TIMEOUT = 240
CASES = ["raw mpi4py Allreduce", "(a) one tensor", "(b) grouped x100", "(c) separate x100"]


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("extra", [[], ["--boundary"]], ids=["in-graph", "boundary"])
def test_benchmark_prints_every_case(extra):
    result = run_under_mpi(2, [str(SCRIPT), "--sizes", "4KB,256KB", "--scale", "0.05",
                               "--repeat", "1", *extra], timeout=TIMEOUT)
    assert result.returncode == 0, describe(result)
    def table(out: str) -> list:
        return [line.split() for line in out.splitlines()
                if line.strip().startswith(("4KB", "256KB"))]

    rows = table(result.ranks[0].stdout)
    assert table(result.ranks[1].stdout) == [], result.stdout  # rank 0 alone prints
    for size in ("4KB", "256KB"):
        for case in CASES:
            matching = [r for r in rows if r[0] == size and " ".join(r[1:]).startswith(case)]
            assert len(matching) == 1, (size, case, result.stdout)
    # Every timing is a positive number of milliseconds.
    for row in rows:
        median_ms = float(row[-5] if row[1] != "raw" else row[-3])
        assert median_ms > 0, row

"""HVDKERAS_AUTOTUNE: the CSV trial log, the final values, and fixed knobs.

Launches 2-rank jobs of tests/scripts/autotune_job.py (many allreduce ops in
a tf.function, the same number of steps on every rank) until rank 0's log
has its final row. The tuner (ops/core/autotuner.cc) searches the fusion
threshold grid at the starting cycle time, then the cycle-time grid at the
best threshold, and keeps the best-scoring pair; a knob set explicitly in
the environment is not searched.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from mpi_runner import describe, run_under_mpi

SCRIPT = Path(__file__).resolve().parent / "scripts" / "autotune_job.py"
JOB_TIMEOUT_S = 240
RANKS = 2
MIB = 1 << 20
THRESHOLDS = [m * MIB for m in (0, 1, 2, 4, 8, 16, 32, 64, 128)]
CYCLE_TIMES = [0.25, 0.5, 1.0, 2.0, 5.0, 10.0]
DEFAULT_CYCLE_MS = 1.0
HEADER = ["trial", "fusion_threshold_bytes", "cycle_time_ms", "score_bytes_per_second",
          "best_so_far", "final"]

pytestmark = [pytest.mark.usefixtures("op_library_built"),
              pytest.mark.slow, pytest.mark.timeout(JOB_TIMEOUT_S + 60)]



def run_job(tmp_path: Path, env: dict) -> tuple[list[dict], dict, list[dict]]:
    """Returns (trial rows, the final row, each rank's engine_config)."""
    log = tmp_path / "autotune.csv"
    result = run_under_mpi(RANKS, [str(SCRIPT), str(tmp_path)], timeout=JOB_TIMEOUT_S,
                           env={"HVDKERAS_AUTOTUNE": "1", "HVDKERAS_AUTOTUNE_LOG": str(log),
                                **env})
    assert result.returncode == 0, describe(result)
    with open(log, newline="") as f:
        rows = list(csv.reader(f))
    assert rows and rows[0] == HEADER, rows[:1]
    body = [dict(zip(HEADER, row)) for row in rows[1:]]
    finals = [r for r in body if r["final"] == "1"]
    assert len(finals) == 1 and body[-1] is finals[0], f"one final row, last:\n{rows}"
    final = finals[0]
    assert final["trial"] == "final" and final["score_bytes_per_second"] == "", final
    trials = body[:-1]
    for n, row in enumerate(trials, start=1):
        assert len(row) == len(HEADER), row
        assert int(row["trial"]) == n and row["final"] == "0", row
        row["fusion_threshold_bytes"] = int(row["fusion_threshold_bytes"])
        row["cycle_time_ms"] = float(row["cycle_time_ms"])
        row["score_bytes_per_second"] = float(row["score_bytes_per_second"])
        assert row["score_bytes_per_second"] > 0, row
    # best_so_far marks each new maximum of the score.
    best = -1.0
    for row in trials:
        is_best = row["score_bytes_per_second"] > best
        assert row["best_so_far"] == ("1" if is_best else "0"), (row, best)
        best = max(best, row["score_bytes_per_second"])
    final = {"fusion_threshold_bytes": int(final["fusion_threshold_bytes"]),
             "cycle_time_ms": float(final["cycle_time_ms"])}
    winner = max(trials, key=lambda r: r["score_bytes_per_second"])
    assert final == {k: winner[k] for k in final}, (final, winner)
    configs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(RANKS)]
    for c in configs:
        assert c["autotune"] is True, c
        assert (c["fusion_threshold"], c["cycle_time_ms"]) == (
            final["fusion_threshold_bytes"], final["cycle_time_ms"]), (c, final)
    assert len({c["steps"] for c in configs}) == 1, configs
    return trials, final, configs


def test_autotune_searches_thresholds_then_cycle_times(tmp_path):
    trials, final, configs = run_job(tmp_path, {})
    first = trials[:len(THRESHOLDS)]
    assert [r["fusion_threshold_bytes"] for r in first] == THRESHOLDS, trials
    assert all(r["cycle_time_ms"] == DEFAULT_CYCLE_MS for r in first), trials
    best_threshold = max(first, key=lambda r: r["score_bytes_per_second"])["fusion_threshold_bytes"]
    second = trials[len(THRESHOLDS):]
    assert [r["cycle_time_ms"] for r in second] == [c for c in CYCLE_TIMES
                                                    if c != DEFAULT_CYCLE_MS], trials
    assert all(r["fusion_threshold_bytes"] == best_threshold for r in second), trials
    print(f"autotune: {len(trials)} trials, final {final}, steps {configs[0]['steps']}")


def test_explicit_fusion_threshold_stays_fixed(tmp_path):
    fixed = 3 * MIB + 4096
    trials, final, configs = run_job(tmp_path, {"HVDKERAS_FUSION_THRESHOLD": str(fixed)})
    assert [r["cycle_time_ms"] for r in trials] == CYCLE_TIMES, trials
    assert all(r["fusion_threshold_bytes"] == fixed for r in trials), trials
    assert final["fusion_threshold_bytes"] == fixed
    assert all(c["fusion_threshold"] == fixed for c in configs), configs

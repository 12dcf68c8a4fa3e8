"""GPU statistics in the epoch logs.

The readings-to-logs logic is pure and tested with made-up readings. NVML
itself cannot run here (no NVIDIA driver), so the gathering test feeds the
real callback made-up readings through a stand-in reader, named as such in
tests/scripts/gpu_stats_job.py; the no-driver test runs the real
nvidia-ml-py, which finds no driver, on 2 ranks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hvdkeras.gpu import nvml
from hvdkeras.gpu.stats_logs import EpochSummary, logs_from
from mpi_runner import describe, run_under_mpi

SCRIPT = Path(__file__).resolve().parent / "scripts" / "gpu_stats_job.py"
JOB_TIMEOUT_S = 240


def test_epoch_summary_means_and_peaks():
    summary = EpochSummary()
    assert summary.result() is None
    summary.add({"utilization": 40.0, "memory_used_mb": 900.0, "power_w": 100.0,
                 "temperature_c": 60.0})
    summary.add({"utilization": 80.0, "memory_used_mb": 700.0, "power_w": None,
                 "temperature_c": 65.0, "unknown": 1.0})
    assert summary.result() == {"utilization": 60.0, "memory_used_mb": 900.0, "power_w": 100.0,
                                "temperature_c": 65.0}


def test_logs_name_every_rank():
    logs = logs_from([{"utilization": 60.0, "power_w": 250.5}, None,
                      {"memory_used_mb": 1024.0, "temperature_c": 70.0}])
    assert logs == {"rank0_gpu_utilization": 60.0, "rank0_gpu_power_w": 250.5,
                    "rank2_gpu_memory_used_mb": 1024.0, "rank2_gpu_temperature_c": 70.0}
    assert logs_from([None, None]) == {}


def test_interval_must_be_positive():
    import hvdkeras as hvd

    with pytest.raises(ValueError, match=r"interval_seconds=0\): give a positive number"):
        hvd.callbacks.GPUStatsCallback(interval_seconds=0)


def test_no_driver_here_means_no_gpus():
    reason = nvml.unavailable_reason()
    if reason is None:
        pytest.skip("an NVIDIA driver is present; tests/gpu covers this machine")
    assert "no NVIDIA driver" in reason
    assert nvml.device_count() == 0 and nvml.list_gpus() == []
    assert nvml.handle_for("0") is None


def _run(mode: str, tmp_path: Path):
    result = run_under_mpi(2, [str(SCRIPT), mode, str(tmp_path)], timeout=JOB_TIMEOUT_S)
    assert result.returncode == 0, describe(result)
    return result, [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.usefixtures("op_library_built")
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_callback_gathers_every_ranks_figures(tmp_path: Path):
    _, ranks = _run("stand-in", tmp_path)
    # Each epoch: one reading at its start (scale 10, then 30 at the next
    # epoch's start...) and one at its end; the mean of 10 and 30 is 20.
    expected = {}
    for r in range(2):
        expected[f"rank{r}_gpu_utilization"] = [20.0 * (r + 1)] * 2
        expected[f"rank{r}_gpu_memory_used_mb"] = [100.0 * (r + 1), 50.0]
        expected[f"rank{r}_gpu_temperature_c"] = [40.0 + r] * 2
    for r, result in enumerate(ranks):
        logs = result["logs"]
        assert {k: v for k, v in logs.items() if k.startswith("rank")} == expected, (r, logs)
        assert len(logs["loss"]) == 2


@pytest.mark.slow
@pytest.mark.usefixtures("op_library_built")
@pytest.mark.timeout(JOB_TIMEOUT_S + 60)
def test_without_a_driver_logs_are_unchanged_and_it_is_said_once(tmp_path: Path):
    if nvml.unavailable_reason() is None:
        pytest.skip("an NVIDIA driver is present; the no-driver path cannot be shown here")
    result, ranks = _run("no-driver", tmp_path)
    for r in ranks:
        assert sorted(r["logs"]) == r["without"] == ["loss"]
    notice = "no NVIDIA driver was found"
    assert result.ranks[0].stderr.count(notice) == 1, result.ranks[0].stderr
    assert notice not in result.ranks[1].stderr

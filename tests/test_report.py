"""`hvdkeras report`: reading a run directory, the engine's phases from a
timeline, the per-epoch engine figures, and the report itself (PNGs and one
HTML page) drawn from a run directory written here.

A 2-rank recipe run whose report and TensorBoard logs are checked is in
tests/test_run_outputs.py.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdkeras.callbacks.engine_stats import epoch_figures
from hvdkeras.engine.stats import EngineStats
from hvdkeras.recipes.paths import run_dir_of
from hvdkeras.report import ReportError, write_report
from hvdkeras.report import run_data, timeline_phases

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

HISTORY = """epoch,accuracy,hvdkeras_collective_ms_per_step,hvdkeras_examples_per_second,\
hvdkeras_step_ms,hvdkeras_wait_ms_per_step,learning_rate,loss,val_accuracy,val_loss
0,0.5,1.0,900.0,20.0,2.0,0.001,1.6,0.8,0.7
1,0.9,0.9,1000.0,18.0,1.0,0.002,0.4,0.9,0.3
2,0.95,0.8,1100.0,17.0,0.5,0.002,0.2,,0.2
"""


def _trace(path: Path) -> None:
    """Two fused tensors sharing their phases, one negotiated longer."""
    def span(pid, name, begin, end):
        return [{"ph": "B", "pid": pid, "name": name, "ts": begin},
                {"ph": "E", "pid": pid, "ts": end}]
    events = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "a"}}]
    for pid, negotiate_from in ((1, 0), (2, 500)):
        events += span(pid, "NEGOTIATE_ALLREDUCE", negotiate_from, 1000)
        events += [{"ph": "B", "pid": pid, "name": "ALLREDUCE", "ts": 1000}]
        events += span(pid, "MEMCPY_IN_FUSION_BUFFER", 1000, 1200)
        events += span(pid, "SHM_ALLREDUCE", 1200, 2000)
        events += [{"ph": "E", "pid": pid, "ts": 2500}]
    path.write_text(json.dumps(events))


def _run_dir(tmp_path: Path, timeline: bool = True) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.csv").write_text(HISTORY)
    (run / "run.json").write_text(json.dumps({"name": "digits-cnn", "ranks": 2,
                                              "global_batch": 64, "steps_per_epoch": 22}))
    if timeline:
        _trace(run / "timeline.json")
    return run


def test_history_is_read_from_the_csv_log_with_one_based_epochs(tmp_path):
    run = run_data.load_run(_run_dir(tmp_path))
    assert run.epochs == [1, 2, 3] and run.source == "history.csv"
    assert run.history["loss"] == [1.6, 0.4, 0.2]
    assert math.isnan(run.history["val_accuracy"][2])
    assert run.metric_names() == ["loss", "accuracy"]
    assert [p.name for p in run.timelines] == ["timeline.json"]
    assert run.summary["ranks"] == 2


def test_history_falls_back_to_run_json(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps(
        {"initial_epoch": 2, "history": {"loss": [0.5, 0.4], "accuracy": [0.8, 0.85]}}))
    run = run_data.load_run(tmp_path)
    assert run.epochs == [3, 4] and run.history["loss"] == [0.5, 0.4]
    assert run.source == "run.json"


def test_a_directory_without_history_is_refused_with_the_fix(tmp_path):
    with pytest.raises(ValueError, match="no per-epoch history.*callbacks.csv_logger"):
        run_data.load_run(tmp_path)
    with pytest.raises(ReportError, match="is not a directory"):
        write_report(tmp_path / "missing")


def test_phases_are_unions_over_fused_tensors():
    assert timeline_phases.union_ms([(0, 1000), (500, 1500), (3000, 4000)]) == 2.5
    assert timeline_phases.phase_totals_ms([]) == {}


def test_phase_totals_of_a_trace(tmp_path):
    _trace(tmp_path / "t.json")
    totals = timeline_phases.phase_totals_ms(timeline_phases.read_events(tmp_path / "t.json"))
    # Negotiation 0-1000 (the union of 0-1000 and 500-1000), the copy 200 us,
    # the reduction 800 us, and 500 us of the collective outside both.
    assert totals == {"NEGOTIATE": 1.0, "SHM_ALLREDUCE": 0.8, "other execution": 0.5,
                      "MEMCPY_IN_FUSION_BUFFER": 0.2}
    assert list(totals)[0] == "NEGOTIATE"  # largest first


def test_epoch_figures():
    spent = EngineStats(ops=40, batches=4, bytes_reduced=4 << 20, execute_seconds=0.02,
                        wait_seconds=0.004)
    assert epoch_figures(spent, 4, 0.2, 128) == {
        "hvdkeras_step_ms": 50.0, "hvdkeras_collective_ms_per_step": 5.0,
        "hvdkeras_wait_ms_per_step": 1.0, "hvdkeras_reduced_mb_per_step": 1.0,
        "hvdkeras_batches_per_step": 1.0, "hvdkeras_examples_per_second": 2560.0}
    assert "hvdkeras_examples_per_second" not in epoch_figures(spent, 4, 0.2)
    assert epoch_figures(spent, 0, 0.2) == {}
    # Gathered bytes show only when the steps gathered (zero_stage=3).
    gathering = EngineStats(ops=40, batches=4, bytes_reduced=4 << 20, bytes_gathered=8 << 20)
    assert epoch_figures(gathering, 4, 0.2)["hvdkeras_gathered_mb_per_step"] == 2.0
    assert (EngineStats(2, 2, 10, 1.0, 1.0) - EngineStats(1, 1, 4, 0.5, 0.25)
            == EngineStats(1, 1, 6, 0.5, 0.75))


def test_run_dir_of_a_recipe():
    def recipe(csv=None, checkpoint=None, tensorboard=None):
        return {"callbacks": {"csv_logger": csv and {"path": csv},
                              "tensorboard": tensorboard and {"log_dir": tensorboard}},
                "checkpoint": checkpoint and {"dir": checkpoint}}
    assert run_dir_of(recipe(csv="/r/d/history.csv", checkpoint="/x/ck")) == "/r/d"
    assert run_dir_of(recipe(checkpoint="/r/d/checkpoints/")) == "/r/d"
    assert run_dir_of(recipe(tensorboard="/r/d/tb")) == "/r/d"
    assert run_dir_of(recipe()) is None


def test_report_writes_pngs_and_one_self_contained_page(tmp_path):
    run = _run_dir(tmp_path)
    index = write_report(run)
    assert index == run / "report" / "index.html"
    pngs = sorted(p.name for p in index.parent.glob("*.png"))
    assert pngs == ["curves.png", "learning_rate.png", "step_time.png", "throughput.png",
                    "timeline_phases.png"]
    for name in pngs:
        assert (index.parent / name).read_bytes().startswith(PNG_MAGIC), name
    page = index.read_text()
    assert page.count("data:image/png;base64,") == len(pngs)  # nothing to fetch
    assert "digits-cnn" in page and "<th>val_loss</th>" in page
    assert not [p for p in index.parent.iterdir() if p.name.startswith(".")]  # no temp files


def test_report_shows_what_a_gathering_run_moved(tmp_path):
    """A zero_stage=3 run logs the MB gathered per step: the report charts it
    beside the MB reduced."""
    run = tmp_path / "zero3"
    run.mkdir()
    (run / "history.csv").write_text(
        "epoch,loss,hvdkeras_reduced_mb_per_step,hvdkeras_gathered_mb_per_step\n"
        "0,1.0,0.95,0.96\n1,0.5,0.95,0.96\n")
    index = write_report(run)
    assert (index.parent / "traffic.png").read_bytes().startswith(PNG_MAGIC)
    assert "gathered" in index.read_text()


def test_report_leaves_out_what_the_run_did_not_record(tmp_path):
    run = tmp_path / "plain"
    run.mkdir()
    (run / "history.csv").write_text("epoch,loss\n0,1.0\n1,0.5\n")
    index = write_report(run)
    assert sorted(p.name for p in index.parent.glob("*.png")) == ["curves.png"]


def test_report_command(tmp_path):
    run = _run_dir(tmp_path, timeline=False)
    cli = [sys.executable, "-m", "hvdkeras.cli", "report"]
    ok = subprocess.run([*cli, str(run)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.strip().endswith("index.html"), ok.stderr
    bad = subprocess.run([*cli, str(tmp_path / "nope")], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "is not a directory" in bad.stderr, bad.stderr


def test_the_report_needs_nothing_beyond_a_default_install():
    """matplotlib is a core dependency: `hvdkeras report` and the report that
    `hvdkeras train` ends with work after a plain `pip install hvdkeras`; the
    old `[report]` extra still resolves (empty)."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml")
                            .read_text())["project"]
    names = [re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]]
    assert "matplotlib" in names
    assert project["optional-dependencies"]["report"] == []

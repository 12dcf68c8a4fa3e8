"""Every bundled recipe, end to end on 2 ranks, through `hvdkeras train`.

* digits: the README's main job, in full: >= 95% validation accuracy (fixed
  seed in the recipe), checkpoints, history CSV.
* tabular_mlp, warmup_cosine, resnet50_synthetic: short versions through
  `--set` overrides (a few steps).
* warmup_cosine also resumes from its checkpoint, and the learning rate at
  every epoch end matches the warmup + cosine formula, across the restart.
* digits_parquet needs TF 2.16-2.17 + tensorflow-io: here it must stop before
  launching (test_recipes_schema.py); the TensorFlow versions leg runs it on 2.17.1
  (test_recipes_io.py).

Every job runs under a timeout that kills its whole process group.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recipe_helpers import learning_rate_at, train

REPO = Path(__file__).resolve().parent.parent
RECIPES = REPO / "recipes"
TIMEOUT = 600



pytestmark = pytest.mark.usefixtures("op_library_built")


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_digits_main_job_reaches_95_percent(tmp_path):
    result, summary = train(RECIPES / "digits.yaml", summary=tmp_path / "summary.json",
                            cwd=tmp_path, timeout=TIMEOUT)
    final = summary["final"]
    assert final["val_accuracy"] >= 0.95, json.dumps(summary["history"], indent=1)
    assert summary["ranks"] == 2 and summary["epochs_run"] == 12
    assert summary["global_batch"] == 64 and summary["steps_per_epoch"] == 22
    # "in under 2 minutes here": the ranks' own time, start to summary.
    assert summary["seconds"] < 120, summary["seconds"]
    checkpoints = tmp_path / "runs" / "digits" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("epoch-*.keras")) == [
        "epoch-00011.keras", "epoch-00012.keras"]
    assert summary["newest_checkpoint"] == str(checkpoints / "epoch-00012.keras")
    assert (tmp_path / "runs" / "digits" / "history.csv").read_text().count("\n") == 13
    out = result.stdout
    assert "hvdkeras: ===== digits-cnn: finished in" in out
    assert f"checkpoints: {checkpoints} (newest: epoch-00012.keras)" in out
    assert "final metrics (epoch 12): loss" in out
    # The run's report (tests/test_report.py checks its contents).
    report = tmp_path / "runs" / "digits" / "report" / "index.html"
    assert f"hvdkeras: report: {report}" in out and report.is_file()


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_tabular_mlp_short_with_overrides_and_engine_knobs(tmp_path):
    """Also exercises mixed precision, bf16 gradient compression, local
    gradient accumulation (2 passes per update) and sharded optimizer state
    (training.zero_stage=2) on 2 ranks."""
    timeline = tmp_path / "timeline.json"
    history = tmp_path / "history.csv"
    _, summary = train(RECIPES / "tabular_mlp.yaml",
                       "training.epochs=2", "training.steps_per_epoch=4", "data.batch_size=16",
                       "training.mixed_precision=mixed_bfloat16", "optimizer.compression=bf16",
                       "optimizer.backward_passes_per_step=2", "training.zero_stage=2",
                       f"engine.timeline={timeline}", "engine.cycle_time_ms=2",
                       f"callbacks.csv_logger={{path: {history}}}",
                       summary=tmp_path / "summary.json", timeout=TIMEOUT)
    assert summary["epochs_run"] == 2 and summary["steps_per_epoch"] == 4
    assert summary["global_batch"] == 32
    assert summary["learning_rate_plan"]["updates_per_epoch"] == 2
    # Exponential decay (0.8 per epoch) over optimizer updates: 2 per epoch here.
    assert summary["history"]["learning_rate"] == pytest.approx([4e-3 * 0.8, 4e-3 * 0.64],
                                                                rel=1e-3)
    assert all(math.isfinite(v) for v in summary["history"]["loss"])
    assert timeline.exists() and timeline.stat().st_size > 0  # HVDKERAS_TIMELINE reached rank 0
    assert history.read_text().startswith("epoch,")


def _expected_rates(overrides, size, steps_per_epoch, epochs):
    from hvdkeras.recipes import load_recipe, lr_plan

    recipe, _ = load_recipe(str(RECIPES / "warmup_cosine.yaml"), overrides, environment=False)
    plan = lr_plan.schedule_plan(recipe, size, steps_per_epoch, epochs * steps_per_epoch)
    return [learning_rate_at(plan, (e + 1) * steps_per_epoch, size) for e in range(epochs)]


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_warmup_cosine_resumes_and_follows_the_schedule(tmp_path):
    common = [f"checkpoint.dir={tmp_path / 'ckpt'}", "checkpoint.best_only=false",
              "checkpoint.keep=2", "training.steps_per_epoch=4"]
    first = common + ["training.epochs=2"]
    _, summary = train(RECIPES / "warmup_cosine.yaml", *first,
                       summary=tmp_path / "first.json", timeout=TIMEOUT)
    assert summary["initial_epoch"] == 0 and summary["epochs_run"] == 2
    assert summary["learning_rate_plan"]["warmup_steps"] == 8
    assert summary["history"]["learning_rate"] == pytest.approx(
        _expected_rates(first, 2, 4, 2), rel=1e-5)

    second = common + ["training.epochs=4"]
    result, summary = train(RECIPES / "warmup_cosine.yaml", *second,
                            summary=tmp_path / "second.json", timeout=TIMEOUT)
    assert "resumed from" in result.stdout and "epoch-00002.keras" in result.stdout
    assert summary["initial_epoch"] == 2 and summary["epochs_run"] == 2
    assert summary["last_epoch"] == 4
    # The optimizer's step count came back with the checkpoint: epochs 3 and 4
    # sit at steps 12 and 16 of the (4-epoch) warmup + cosine curve.
    assert summary["history"]["learning_rate"] == pytest.approx(
        _expected_rates(second, 2, 4, 4)[2:], rel=1e-5)
    assert summary["newest_checkpoint"].endswith("epoch-00004.keras")

    # Nothing left to do: the summary says so and still reports metrics.
    result, summary = train(RECIPES / "warmup_cosine.yaml", *second,
                            summary=tmp_path / "third.json", timeout=TIMEOUT)
    assert summary["epochs_run"] == 0 and "val_accuracy" in summary["final"]
    assert "nothing left to train" in result.stdout


@pytest.mark.slow
@pytest.mark.extended  # the other recipe runs cover the machinery with small models
@pytest.mark.timeout(TIMEOUT + 60)
def test_resnet50_synthetic_short(tmp_path):
    _, summary = train(RECIPES / "resnet50_synthetic.yaml",
                       "data.batch_size=2", "data.input_shape=[32,32,3]", "data.samples=4",
                       "training.steps=2", "optimizer.learning_rate=1e-4",
                       summary=tmp_path / "summary.json", timeout=TIMEOUT)
    assert summary["epochs_run"] == 1 and summary["steps_per_epoch"] == 2
    assert summary["global_batch"] == 4
    assert summary["examples_per_second"] is not None

"""What a 2-rank recipe run leaves for a person to look at: TensorBoard logs
holding hvdkeras's scalars (rank 0 alone writes them), `run.json`, and the
report `hvdkeras train` draws at the end (PNGs and one HTML page).

The bundled digits recipe, shortened to 3 epochs, with TensorBoard and an
engine timeline switched on through `--set`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tensorflow as tf

from recipe_helpers import train

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 600
ENGINE_SCALARS = {"hvdkeras_step_ms", "hvdkeras_collective_ms_per_step",
                  "hvdkeras_wait_ms_per_step", "hvdkeras_reduced_mb_per_step",
                  "hvdkeras_batches_per_step", "hvdkeras_examples_per_second"}

pytestmark = pytest.mark.usefixtures("op_library_built")


def _scalars(directory: Path) -> dict:
    """tag -> [(step, value)] from the event files under `directory`."""
    found: dict = {}
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor)) if value.HasField("tensor") \
                    else value.simple_value
                found.setdefault(value.tag, []).append((event.step, number))
    return found


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_tensorboard_holds_hvdkeras_scalars_and_the_run_gets_a_report(tmp_path):
    result, summary = train(REPO / "recipes" / "digits.yaml", "training.epochs=3",
                            "callbacks.tensorboard={log_dir: runs/digits/tensorboard}",
                            "engine.timeline=runs/digits/timeline.json",
                            summary=tmp_path / "summary.json", cwd=tmp_path, timeout=TIMEOUT)
    run = tmp_path / "runs" / "digits"
    # Keras's epoch line keeps to the metrics; the figures go to the loggers.
    epoch_lines = [line for line in result.stdout.splitlines() if "/step - " in line]
    assert len(epoch_lines) == 3 and all("val_loss" in line for line in epoch_lines), epoch_lines
    assert not any("hvdkeras_" in line for line in epoch_lines), epoch_lines
    # Rank 0 alone writes: one file per writer (train, validation).
    events = sorted(p.relative_to(run / "tensorboard").parent.as_posix()
                    for p in (run / "tensorboard").rglob("events.out.tfevents.*"))
    assert events == ["train", "validation"], events
    train_scalars = _scalars(run / "tensorboard" / "train")
    for name in ENGINE_SCALARS | {"loss", "accuracy"}:
        steps = [step for step, _ in train_scalars.get("epoch_" + name, [])]
        assert steps == [0, 1, 2], (name, sorted(train_scalars))
    step_ms = [v for _, v in train_scalars["epoch_hvdkeras_step_ms"]]
    assert all(v > 0 for v in step_ms), step_ms
    # The engine reduced the model's gradients every step: 0.58 MB of float32.
    reduced = [v for _, v in train_scalars["epoch_hvdkeras_reduced_mb_per_step"]]
    assert all(0.5 < v < 0.7 for v in reduced), reduced
    assert _scalars(run / "tensorboard" / "validation")["epoch_loss"]
    # TensorBoard's values are the epoch logs, as in the history.
    history = summary["history"]
    assert [v for _, v in train_scalars["epoch_hvdkeras_step_ms"]] == pytest.approx(
        history["hvdkeras_step_ms"], rel=1e-6)

    assert json.loads((run / "run.json").read_text())["history"] == history
    index = run / "report" / "index.html"
    assert f"hvdkeras: report: {index}" in result.stdout, result.stdout[-3000:]
    pngs = sorted(p.name for p in index.parent.glob("*.png"))
    assert pngs == ["curves.png", "learning_rate.png", "step_time.png", "throughput.png",
                    "timeline_phases.png"]
    assert index.read_text().count("data:image/png;base64,") == 5

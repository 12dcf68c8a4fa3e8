"""Recipe schema, YAML handling, --set overrides and learning-rate plans.

No MPI here: malformed recipes go through `hvdkeras train ... --np 2` in
process with the launcher replaced by a recorder, which proves that nothing
is launched (exit code 2 before any process starts).
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hvdkeras import cli
from hvdkeras.recipes import (RecipeError, bundled_recipes, launching, load_recipe, lr_plan,
                              schema_data, validation)
from hvdkeras.recipes.spec import Issue
from hvdkeras.recipes.yaml_source import SourceError, apply_overrides, parse_text
from recipe_helpers import learning_rate_at

REPO = Path(__file__).resolve().parent.parent

GOOD = """\
version: 1
name: t
model:
  name: hvdkeras.recipes.models:mlp
data:
  source: bundled
  layout: flat
  batch_size: 16
  validation: {split: 0.2}
optimizer:
  name: adam
  learning_rate: 1e-3
training:
  epochs: 1
"""


def _doc(text: str):
    return parse_text(textwrap.dedent(text), filename="r.yaml")


def _validate(text: str, overrides=()):
    doc = _doc(text)
    apply_overrides(doc, overrides)
    return validation.validate(doc, recipe_path="/somewhere/r.yaml", cwd="/work")


class Launches:
    """Stands in for every way `hvdkeras train` could start a process."""

    def __init__(self) -> None:
        self.calls = []

    def record(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return 0


@pytest.fixture
def no_launch(monkeypatch):
    launches = Launches()
    import hvdkeras.recipes.launching as launching
    import hvdkeras.recipes.run as run

    monkeypatch.setattr(launching, "launch_ranks", launches.record)
    monkeypatch.setattr(run, "train", launches.record)
    monkeypatch.setattr(subprocess, "Popen", launches.record)
    monkeypatch.setattr(subprocess, "call", launches.record)
    return launches


def _train(tmp_path, text, overrides=(), capsys=None):
    path = tmp_path / "bad.yaml"
    path.write_text(textwrap.dedent(text))
    argv = ["train", str(path), "--np", "2"]
    for override in overrides:
        argv += ["--set", override]
    code = cli.main(argv)
    return code, capsys.readouterr().err


def _swap(old: str, new: str, text: str = GOOD) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


# Each: (id, recipe text, --set overrides, expected pieces of the message).
MALFORMED = [
    ("unknown-top-key",
     _swap("optimizer:\n", "optimiser:\n"), [],
     ["bad.yaml:10: optimiser: unknown key (did you mean 'optimizer'?); allowed keys here: "
      "version, name, description, seed, backend, model, data, optimizer, training"]),
    ("misspelled-nested-key",
     _swap("  name: adam\n", "  nmae: adam\n"), [],
     ["bad.yaml:11: optimizer.nmae: unknown key (did you mean 'name'?); allowed keys here: name, "
      "args, learning_rate, scale_by_world_size, warmup, schedule, compression, "
      "backward_passes_per_step"]),
    ("wrong-type-int",
     _swap("batch_size: 16", "batch_size: many"), [],
     ["bad.yaml:8: data.batch_size: expected an integer >= 1 and <= 1048576, got the string "
      "'many'"]),
    ("bad-value-int",
     _swap("batch_size: 16", "batch_size: 0"), [],
     ["bad.yaml:8: data.batch_size: 0 is out of range; expected an integer >= 1 and <= 1048576"]),
    ("missing-version",
     _swap("version: 1\n", ""), [],
     ["bad.yaml:1: missing required key 'version' (1 (the only schema version so far))"]),
    ("future-version",
     _swap("version: 1", "version: 2"), [],
     ["bad.yaml:1: version: version 2 is not supported; this hvdkeras reads version 1"]),
    ("missing-model",
     _swap("model:\n  name: hvdkeras.recipes.models:mlp\n", ""), [],
     ["bad.yaml:1: missing required key 'model'"]),
    ("negative-learning-rate",
     _swap("learning_rate: 1e-3", "learning_rate: -1e-3"), [],
     ["bad.yaml:12: optimizer.learning_rate: -0.001 is out of range; expected a number > 0"]),
    ("learning-rate-not-a-number",
     _swap("learning_rate: 1e-3", "learning_rate: fast"), [],
     ["bad.yaml:12: optimizer.learning_rate: expected a number > 0, got the string 'fast'"]),
    ("schedule-name-typo",
     _swap("  learning_rate: 1e-3\n", "  learning_rate: 1e-3\n  schedule: {name: cosin}\n"), [],
     ["bad.yaml:13: optimizer.schedule.name: 'cosin' is not allowed (did you mean 'cosine'?); "
      "expected one of 'constant', 'cosine', 'exponential', 'inverse_time', 'piecewise', "
      "'polynomial'"]),
    ("warmup-epochs-and-steps",
     _swap("  learning_rate: 1e-3\n", "  learning_rate: 1e-3\n  warmup:\n    epochs: 1\n"
                                      "    steps: 10\n"), [],
     ["bad.yaml:15: optimizer.warmup.steps: set only one of epochs, steps (found epochs and "
      "steps)"]),
    ("piecewise-multipliers-count",
     _swap("  learning_rate: 1e-3\n", "  learning_rate: 1e-3\n  schedule:\n    name: piecewise\n"
                                      "    boundaries: [10, 20]\n    multipliers: [1, 0.1]\n"), [],
     ["bad.yaml:16: optimizer.schedule.multipliers: has 2 values; with 2 boundaries it needs 3"]),
    ("validation-split-out-of-range",
     _swap("{split: 0.2}", "{split: 1.5}"), [],
     ["bad.yaml:9: data.validation.split: 1.5 is out of range; expected a number > 0 and < 1"]),
    ("unknown-data-source",
     _swap("source: bundled", "source: tfrecords"), [],
     ["bad.yaml:6: data.source: 'tfrecords' is not a data source (did you mean 'tfrecord'?); "
      "expected one of bundled, tfrecord, csv, parquet, synthetic, or a 'module:function'"]),
    ("key-not-used-by-source",
     _swap("  layout: flat\n", "  layout: flat\n  path: rows.csv\n"), [],
     ["bad.yaml:8: data.path: is not used by source 'bundled'; keys for bundled sources: name, "
      "layout"]),
    ("csv-without-path",
     _swap("  source: bundled\n  layout: flat\n", "  source: csv\n"), [],
     ["bad.yaml:5: data: source 'csv' needs 'path' (a file, glob or list of them)"]),
    ("optimizer-name-typo",
     _swap("name: adam", "name: adamm"), [],
     ["bad.yaml:11: optimizer.name: 'adamm' is not a Keras optimizer (did you mean 'Adam'?); "
      "use one of Adadelta, Adafactor, Adagrad, Adam, AdamW"]),
    ("optimizer-argument-typo",
     _swap("  name: adam\n", "  name: sgd\n  args: {momentm: 0.9}\n"), [],
     ["bad.yaml:12: optimizer.args.momentm: SGD takes no argument 'momentm' (did you mean "
      "'momentum'?)"]),
    ("application-name-case",
     _swap("name: hvdkeras.recipes.models:mlp", "name: resnet50"), [],
     ["bad.yaml:4: model.name: 'resnet50' is not a keras.applications model (did you mean "
      "'ResNet50'?)"]),
    ("model-module-missing",
     _swap("name: hvdkeras.recipes.models:mlp", "name: no_such_package.models:build"), [],
     ["bad.yaml:4: model.name: cannot import module 'no_such_package' for model.name "
      "'no_such_package.models:build' (is it installed or on PYTHONPATH?)"]),
    ("model-function-typo",
     _swap("name: hvdkeras.recipes.models:mlp", "name: hvdkeras.recipes.models:mpl"), [],
     ["bad.yaml:4: model.name: module 'hvdkeras.recipes.models' has no function 'mpl' (did you "
      "mean 'mlp'?)"]),
    ("model-argument-typo",
     _swap("  name: hvdkeras.recipes.models:mlp\n",
           "  name: hvdkeras.recipes.models:mlp\n  args: {hiden: [32]}\n"), [],
     ["bad.yaml:5: model.args.hiden: hvdkeras.recipes.models:mlp takes no argument 'hiden' (did "
      "you mean 'hidden'?); it takes: activation, dropout, hidden, input_shape, normalize, "
      "num_classes"]),
    ("loss-typo",
     GOOD + "  loss: sparse_categorical_crosentropy\n", [],
     ["bad.yaml:15: training.loss: 'sparse_categorical_crosentropy' is not a Keras loss (did "
      "you mean 'sparse_categorical_crossentropy'?)"]),
    ("metric-typo",
     GOOD + "  metrics: [acuracy]\n", [],
     ["bad.yaml:15: training.metrics[0]: 'acuracy' is not a Keras metric (did you mean "
      "'accuracy'?)"]),
    ("best-only-without-validation",
     _swap("  validation: {split: 0.2}\n", "") + "checkpoint: {dir: ck, best_only: true}\n", [],
     ["bad.yaml:14: checkpoint.monitor: 'val_loss' needs validation data: set data.validation "
      "(split or path), or monitor a training metric such as 'loss'"]),
    ("duplicate-key",
     GOOD + "  epochs: 2\n", [],
     ["bad.yaml:15: training.epochs: duplicate key (also on line 14); YAML would silently keep "
      "only the last one"]),
    # Hostile YAML: bounded, every tag refused with its line, the real line named.
    ("alias-bomb",
     "version: 1\n" + "a0: &a0 [x, x, x, x, x, x, x, x, x]\n" + "".join(
         f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)), [],
     ["the recipe expands to more than 100000 values"]),
    ("tag-on-a-mapping",
     _swap("model:\n", "model: !!python/object/apply:os.system\n"), [],
     ["bad.yaml:3: YAML tags such as '!!python/object/apply:os.system' are not allowed in a "
      "recipe"]),
    ("tag-on-a-list",
     GOOD + "  metrics: !!python/tuple [accuracy]\n", [],
     ["bad.yaml:15: YAML tags such as '!!python/tuple' are not allowed"]),
    ("tag-on-a-value",
     _swap("name: t", "name: !!str t"), [],
     ["bad.yaml:2: YAML tags such as '!!str' are not allowed"]),
    ("tag-in-an-override",
     GOOD, ["name=!custom x"],
     ["--set name=!custom x: YAML tags such as '!custom' are not allowed"]),
    ("key-without-colon",
     _swap("optimizer:\n", "optimizer\n"), [],
     ["bad.yaml:10: YAML syntax error: while scanning a simple key, could not find expected ':' "
      "(noticed on line 11)"]),
    ("unclosed-quote",
     _swap("name: t", "name: 't"), [],
     ["bad.yaml:2: YAML syntax error: while scanning a quoted scalar"]),
    ("larger-than-a-recipe",
     GOOD + "description: " + "x" * (1 << 20) + "\n", [],
     ["bad.yaml:1: the recipe is larger than 1 MiB"]),
    ("yaml-syntax-error",
     _swap("  batch_size: 16\n", "  batch_size: [16\n"), [],
     # The line with the unclosed bracket, not the line where YAML noticed it.
     ["bad.yaml:8: YAML syntax error: while parsing a flow sequence", "(noticed on line 9)"]),
    ("mixed-precision-true",
     GOOD + "  mixed_precision: true\n", [],
     ["bad.yaml:15: training.mixed_precision: say which: mixed_float16 (GPUs) or mixed_bfloat16"]),
    ("engine-size-unit",
     GOOD + "engine: {fusion_threshold: 64 parsecs}\n", [],
     ["bad.yaml:15: engine.fusion_threshold: '64 parsecs' is not a size; expected a size in "
      "bytes up to 1TiB (an integer, or a string like '64MiB') (units: B, KB, KiB, MB, MiB, "
      "GB, GiB)"]),
    ("compression-value",
     _swap("  learning_rate: 1e-3\n", "  learning_rate: 1e-3\n  compression: fp8\n"), [],
     ["bad.yaml:13: optimizer.compression: 'fp8' is not allowed (did you mean 'fp16'?); "
      "expected one of 'none', 'fp16', 'bf16'"]),
    ("epochs-and-steps",
     GOOD + "  steps: 100\n", [],
     ["bad.yaml:15: training.steps: set training.epochs or training.steps, not both"]),
    ("missing-data-file",
     _swap("  source: bundled\n  layout: flat\n",
           "  source: csv\n  path: /no/such/dir/rows-*.csv\n"), [],
     ["bad.yaml:7: data.path: no file matches '/no/such/dir/rows-*.csv'"]),
    ("not-a-mapping",
     "- version: 1\n- model: x\n", [],
     ["bad.yaml:1: a recipe must be a mapping of sections (version, model, data, ...), got list"]),
    ("set-unknown-key",
     GOOD, ["trainig.epochs=3"],
     ["--set trainig.epochs=3: trainig: unknown key (did you mean 'training'?)"]),
    ("set-into-a-number",
     GOOD, ["data.batch_size.x=1"],
     ["--set data.batch_size.x=1: data.batch_size is a number, not a mapping; cannot set "
      "data.batch_size.x"]),
    ("set-bad-value",
     GOOD, ["training.epochs=-3"],
     ["--set training.epochs=-3: training.epochs: -3 is out of range; expected an integer >= 1"]),
    ("set-without-equals",
     GOOD, ["training.epochs"],
     ["--set training.epochs: expected KEY.PATH=VALUE, e.g. --set data.batch_size=64"]),
]


@pytest.mark.parametrize("text,overrides,expected", [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])
def test_malformed_recipe_exits_2_before_launching(tmp_path, capsys, no_launch, text,
                                                   overrides, expected):
    code, err = _train(tmp_path, text, overrides, capsys)
    assert code == 2, err
    for piece in expected:
        assert piece in err, f"expected {piece!r} in:\n{err}"
    assert err.startswith("hvdkeras: error: the recipe has ")
    assert no_launch.calls == []


def test_enough_malformed_cases():
    assert len(MALFORMED) >= 20


def test_every_problem_is_reported_at_once(tmp_path, capsys, no_launch):
    text = _swap("batch_size: 16", "batch_size: 0", _swap("name: adam", "nmae: adam"))
    code, err = _train(tmp_path, text, (), capsys)
    assert code == 2
    assert "the recipe has 2 problems:" in err
    assert "bad.yaml:8: data.batch_size" in err and "bad.yaml:11: optimizer.nmae" in err


def test_tensorboard_missing_says_to_install_it(tmp_path, capsys, no_launch, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    code, err = _train(tmp_path, GOOD + "callbacks: {tensorboard: {log_dir: tb}}\n", (), capsys)
    assert code == 2
    assert ("bad.yaml:15: callbacks.tensorboard: needs the 'tensorboard' package, which is not "
            "installed (TensorFlow 2.21 no longer installs it): pip install tensorboard") in err
    assert no_launch.calls == []


def _tensorflow_io_usable() -> bool:
    from hvdkeras.recipes.resolve import tensorflow_io_problem

    return tensorflow_io_problem() is None


@pytest.mark.skipif(_tensorflow_io_usable(), reason="tensorflow-io works here (TF 2.17.1 in the versions leg)")
def test_parquet_recipe_says_which_tensorflow_it_needs(capsys, no_launch):
    code = cli.main(["train", str(REPO / "recipes" / "digits_parquet.yaml"), "--np", "2"])
    err = capsys.readouterr().err
    assert code == 2
    assert ("data.source: the parquet source needs tensorflow-io, which runs only on TensorFlow "
            "2.16-2.17 with tensorflow-io 0.37.1") in err
    assert no_launch.calls == []


def test_train_rejects_bad_np(tmp_path, capsys, no_launch):
    path = tmp_path / "ok.yaml"
    path.write_text(GOOD)
    assert cli.main(["train", str(path), "--np", "0"]) == 2
    assert "--np must be at least 1" in capsys.readouterr().err
    assert no_launch.calls == []


def test_valid_recipe_launches_the_rank_command(tmp_path, capsys, no_launch):
    path = tmp_path / "ok.yaml"
    path.write_text(GOOD + "engine: {fusion_threshold: 1MiB, cycle_time_ms: 2.5, timeline: t.json}\n")
    code = cli.main(["train", str(path), "--np", "3", "--set", "training.epochs=2"])
    assert code == 0, capsys.readouterr().err
    (args, kwargs), = no_launch.calls
    command = args[0]
    assert command[:4] == [sys.executable, "-m", "hvdkeras.recipes.run", str(path.resolve())]
    assert command[4:] == ["--set", "training.epochs=2"]
    assert kwargs["np"] == 3
    assert kwargs["env"] == {"HVDKERAS_FUSION_THRESHOLD": str(1 << 20),
                             "HVDKERAS_CYCLE_TIME": "2.5",
                             "HVDKERAS_TIMELINE": str(Path.cwd() / "t.json")}


def test_bad_recipe_from_a_real_shell_exits_2(tmp_path):
    """The installed command, end to end: exit code 2 and the message on stderr."""
    path = tmp_path / "bad.yaml"
    path.write_text(_swap("batch_size: 16", "batch_size: -4"))
    hvdkeras = Path(sys.executable).parent / "hvdkeras"
    result = subprocess.run([str(hvdkeras), "train", str(path), "--np", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert "bad.yaml:8: data.batch_size: -4 is out of range" in result.stderr
    assert "hvdkerasrun" not in result.stderr + result.stdout  # nothing was launched


# --------------------------------------------------------------------------
# YAML 1.1 quirks, locations, normalization
# --------------------------------------------------------------------------


def test_exponent_numbers_are_floats_and_text_fields_keep_their_text():
    recipe, issues = _validate(GOOD + "checkpoint: {dir: off, monitor: no, best_only: yes}\n"
                               "  \ndescription: 1:30\n")
    assert issues == []
    assert recipe["optimizer"]["learning_rate"] == pytest.approx(1e-3)
    assert isinstance(recipe["optimizer"]["learning_rate"], float)
    assert recipe["checkpoint"]["dir"] == "/work/off"        # not False
    assert recipe["checkpoint"]["monitor"] == "no"            # not False
    assert recipe["checkpoint"]["best_only"] is True          # a real boolean stays one
    assert recipe["description"] == "1:30"                    # not 90


@pytest.mark.parametrize("text,value", [("1e-3", 1e-3), ("5E4", 5e4), ("2.5e-2", 0.025),
                                        (".5e1", 5.0), ("3", 3.0), ("'1e-4'", 1e-4)])
def test_learning_rate_spellings(text, value):
    recipe, issues = _validate(_swap("learning_rate: 1e-3", f"learning_rate: {text}"))
    assert issues == []
    assert recipe["optimizer"]["learning_rate"] == pytest.approx(value)


def test_defaults_are_filled_and_paths_resolved():
    recipe, issues = _validate(GOOD + "checkpoint: {dir: ck}\n")
    assert issues == []
    assert recipe["optimizer"]["scale_by_world_size"] is True
    assert recipe["training"]["metrics"] == ["accuracy"]
    assert recipe["data"]["input_shape"] == [64] and recipe["data"]["num_classes"] == 10
    assert recipe["checkpoint"] == {"dir": "/work/ck", "keep": 3, "best_only": False,
                                    "monitor": "val_loss", "mode": "auto", "resume": True,
                                    "every_steps": None}
    assert recipe["engine"] == {"fusion_threshold": None, "cycle_time_ms": None,
                                "timeline": None, "autotune": None}


def test_input_paths_are_relative_to_the_recipe_and_bundled_placeholder():
    text = _swap("  source: bundled\n  layout: flat\n",
                 "  source: csv\n  path: [rows.csv, '{bundled}/digits.csv.gz']\n  label: y\n")
    recipe, issues = _validate(text)
    assert issues == []
    assert recipe["data"]["path"] == ["/somewhere/rows.csv",
                                      str(schema_data.BUNDLED_DATA_DIR / "digits.csv.gz")]
    assert recipe["data"]["compression"] == "auto" and recipe["data"]["header"] is True


def test_locations_point_at_the_line_or_the_override():
    doc = _doc(GOOD)
    apply_overrides(doc, ["optimizer.learning_rate=abc"])
    assert doc.location(("data", "batch_size")) == "r.yaml:8"
    assert doc.location(("data", "validation", "split")) == "r.yaml:9"
    assert doc.location(("optimizer", "learning_rate")) == "--set optimizer.learning_rate=abc"
    assert doc.location(("nowhere",)) == "r.yaml:1"


def test_issue_text():
    issue = Issue("r.yaml:3", ("data", "validation", "split"), "bad")
    assert str(issue) == "r.yaml:3: data.validation.split: bad"
    assert str(Issue("r.yaml:1", ("training", "metrics", 0), "x")) == \
        "r.yaml:1: training.metrics[0]: x"


# --------------------------------------------------------------------------
# --set overrides
# --------------------------------------------------------------------------


def test_overrides_change_values_create_sections_and_parse_yaml():
    recipe, issues = _validate(GOOD, [
        "data.batch_size=64", "optimizer.learning_rate=2e-2", "training.metrics=[accuracy, mae]",
        "optimizer.schedule.name=cosine", "checkpoint.dir=ck", "training.metrics.1=mse",
        "description=yes"])
    assert issues == []
    assert recipe["data"]["batch_size"] == 64
    assert recipe["optimizer"]["learning_rate"] == pytest.approx(0.02)
    assert recipe["training"]["metrics"] == ["accuracy", "mse"]
    assert recipe["optimizer"]["schedule"]["name"] == "cosine"
    assert recipe["checkpoint"]["dir"] == "/work/ck"
    assert recipe["description"] == "yes"


def test_later_overrides_win_and_null_removes_a_section():
    recipe, issues = _validate(GOOD + "checkpoint: {dir: ck}\n",
                               ["data.batch_size=8", "data.batch_size=4", "checkpoint=null"])
    assert issues == []
    assert recipe["data"]["batch_size"] == 4
    assert recipe["checkpoint"] is None


def test_set_steps_replaces_epochs_from_the_file():
    recipe, issues = _validate(GOOD, ["training.steps=5"])
    assert issues == [] and recipe["training"]["steps"] == 5
    recipe, issues = _validate(GOOD + "  steps: 9\n", ["training.epochs=2"])
    assert issues == [] and recipe["training"]["steps"] is None


def test_override_errors_name_the_override():
    with pytest.raises(SourceError, match=r"--set data\.validation\.split\.x=1"):
        apply_overrides(_doc(GOOD), ["data.validation.split.x=1"])
    with pytest.raises(SourceError, match="index 5 is out of range"):
        apply_overrides(_doc(GOOD + "  metrics: [accuracy]\n"), ["training.metrics.5=mae"])


def test_load_recipe_with_overrides_and_bundled_names():
    recipe, _ = load_recipe("digits", ["training.epochs=3"], environment=False)
    assert recipe["name"] == "digits-cnn" and recipe["training"]["epochs"] == 3
    with pytest.raises(RecipeError) as info:
        load_recipe("digits", ["training.epochs=zero"], environment=False)
    assert "--set training.epochs=zero: training.epochs: expected an integer >= 1" in str(info.value)


# --------------------------------------------------------------------------
# Bundled recipes, names, CLI listing
# --------------------------------------------------------------------------

BUNDLED = {"digits", "tabular_mlp", "warmup_cosine", "resnet50_synthetic", "digits_parquet"}


def test_bundled_recipes_are_there_and_valid():
    found = bundled_recipes()
    assert BUNDLED <= set(found)
    for name, path in found.items():
        recipe, _ = load_recipe(str(path), environment=False)
        assert recipe["version"] == 1
        if name != "digits_parquet" or _tensorflow_io_usable():
            load_recipe(str(path))  # names, files and packages too


def test_repo_recipes_dir_mirrors_the_bundled_ones():
    for name, path in bundled_recipes().items():
        assert (REPO / "recipes" / f"{name}.yaml").read_text() == path.read_text()


def test_recipes_and_validate_commands(capsys):
    assert cli.main(["recipes"]) == 0
    out = capsys.readouterr().out
    for name in BUNDLED:
        assert name in out
    assert cli.main(["validate", str(REPO / "recipes" / "digits.yaml"), "--print"]) == 0
    out = capsys.readouterr().out
    assert "name: digits-cnn" in out and "learning_rate: 0.001" in out
    assert out.rstrip().endswith("batch 32 per rank)")


def test_application_and_optimizer_names_come_from_keras():
    from hvdkeras.recipes.models import application_names
    from hvdkeras.recipes.keras_objects import optimizer_classes

    assert {"ResNet50", "MobileNetV2", "EfficientNetB0"} <= set(application_names())
    assert {"adam", "sgd", "adamw", "rmsprop"} <= set(optimizer_classes())
    assert "lossscaleoptimizer" not in optimizer_classes()


# --------------------------------------------------------------------------
# Learning rates: warmup + schedule
# --------------------------------------------------------------------------

SCHEDULES = [
    None,
    {"name": "cosine", "alpha": 0.1},
    {"name": "exponential", "decay_rate": 0.5, "decay_epochs": 2},
    {"name": "exponential", "decay_rate": 0.5, "decay_steps": 7, "staircase": True},
    {"name": "inverse_time", "decay_rate": 0.3},
    {"name": "polynomial", "power": 2.0, "end_multiplier": 0.05},
    {"name": "piecewise", "boundary_epochs": [2, 4], "multipliers": [1.0, 0.1, 0.01]},
    {"name": "constant"},
]


@pytest.mark.parametrize("warmup", [None, {"epochs": 2}, {"steps": 5}])
@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s["name"] if s else "none")
def test_warmup_and_schedule_learning_rates(warmup, schedule):
    from hvdkeras.recipes.keras_objects import make_learning_rate

    import yaml

    text = GOOD.replace("epochs: 1", "epochs: 6")
    overrides = []
    if warmup:
        overrides.append("optimizer.warmup=" + yaml.safe_dump(warmup, default_flow_style=True).strip())
    if schedule:
        overrides.append("optimizer.schedule=" + yaml.safe_dump(schedule, default_flow_style=True).strip())
    recipe, issues = _validate(text, overrides)
    assert issues == []
    size, steps_per_epoch = 4, 10
    learning_rate, plan = make_learning_rate(recipe, size, steps_per_epoch, 6 * steps_per_epoch)
    assert plan["base"] == pytest.approx(1e-3 * size)
    if warmup:
        assert plan["warmup_steps"] == (20 if "epochs" in warmup else 5)
    for step in range(0, 61):
        expected = learning_rate_at(plan, step, size)
        got = float(learning_rate(step)) if callable(learning_rate) else float(learning_rate)
        assert got == pytest.approx(expected, rel=1e-5), f"step {step}"


def test_learning_rate_reference_values():
    """Hand-computed points: warmup from base/size, then cosine down to alpha."""
    recipe, _ = _validate(GOOD, ["optimizer.warmup={steps: 10}",
                                 "optimizer.schedule={name: cosine, alpha: 0.0}"])
    plan = lr_plan.schedule_plan(recipe, size=2, steps_per_epoch=10, total_batches=30)
    base = 2e-3
    assert plan["decay_steps"] == 20
    assert learning_rate_at(plan, 0, 2) == pytest.approx(base / 2)
    assert learning_rate_at(plan, 5, 2) == pytest.approx(base * 0.75)
    assert learning_rate_at(plan, 10, 2) == pytest.approx(base)
    assert learning_rate_at(plan, 20, 2) == pytest.approx(base / 2)
    assert learning_rate_at(plan, 30, 2) == pytest.approx(0.0, abs=1e-12)


def test_backward_passes_count_updates_not_batches():
    recipe, _ = _validate(GOOD, ["optimizer.backward_passes_per_step=2",
                                 "optimizer.warmup={epochs: 1}"])
    plan = lr_plan.schedule_plan(recipe, size=2, steps_per_epoch=10, total_batches=40)
    assert plan["warmup_steps"] == 5 and plan["total_updates"] == 20


def test_engine_env_mapping():
    recipe, _ = _validate(GOOD + "engine: {fusion_threshold: 32MiB, cycle_time_ms: 3, "
                                 "timeline: tl.json, autotune: false}\n")
    assert launching.engine_env(recipe) == {
        "HVDKERAS_FUSION_THRESHOLD": str(32 << 20), "HVDKERAS_CYCLE_TIME": "3.0",
        "HVDKERAS_TIMELINE": "/work/tl.json", "HVDKERAS_AUTOTUNE": "0"}
    recipe, _ = _validate(GOOD)
    assert launching.engine_env(recipe) == {}


def test_math_reference_handles_all_schedules():
    # A sanity check of the pure reference itself (cosine is symmetric around the middle).
    recipe, _ = _validate(GOOD, ["optimizer.schedule={name: cosine}"])
    plan = lr_plan.schedule_plan(recipe, size=1, steps_per_epoch=10, total_batches=10)
    assert learning_rate_at(plan, 5, 1) == pytest.approx(1e-3 * 0.5)
    assert math.isclose(learning_rate_at(plan, 0, 1), 1e-3)


def test_launch_ranks_starts_the_ranks_with_the_engine_variables(tmp_path):
    """Recipe ranks go through the project's launcher (hvdkeras.runner.launch)."""
    script = ("import os, pathlib; pathlib.Path(os.environ['OUT'], os.environ['PMI_RANK'])"
              ".write_text(os.environ['HVDKERAS_CYCLE_TIME'] + ' ' + "
              "os.environ['HVDKERAS_EXPECTED_SIZE'])")
    code = launching.launch_ranks([sys.executable, "-c", script], 2,
                                  env={"OUT": str(tmp_path), "HVDKERAS_CYCLE_TIME": "3.0"})
    assert code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1"]
    assert (tmp_path / "1").read_text() == "3.0 2"


def test_zero_stage_defaults_to_0_and_takes_0_to_3():
    recipe, _ = _validate(GOOD)
    assert recipe["training"]["zero_stage"] == 0
    recipe, _ = _validate(GOOD, ["training.zero_stage=3"])
    assert recipe["training"]["zero_stage"] == 3
    _, issues = _validate(GOOD, ["training.zero_stage=4"])
    assert any("training.zero_stage: 4 is out of range" in str(i) for i in issues), issues


def test_backend_sets_keras_backend_for_every_rank(tmp_path, capsys, no_launch):
    path = tmp_path / "torch.yaml"
    path.write_text("backend: torch\n" + GOOD)
    assert cli.main(["train", str(path), "--np", "2"]) == 0, capsys.readouterr().err
    (_, kwargs), = no_launch.calls
    assert kwargs["env"]["KERAS_BACKEND"] == "torch"


def test_sharded_state_is_accepted_under_every_backend():
    accumulating = GOOD.replace("  learning_rate: 1e-3\n", "  learning_rate: 1e-3\n"
                                "  backward_passes_per_step: 2\n")
    assert accumulating != GOOD
    for backend in ("tensorflow", "jax", "torch"):
        for text in (GOOD, accumulating):
            recipe, issues = _validate(f"backend: {backend}\n" + text + "  zero_stage: 2\n")
            assert not issues and recipe["training"]["zero_stage"] == 2, (backend, issues)


@pytest.mark.parametrize("text, message", [
    ("backend: mxnet\n" + GOOD, "tensorflow"),
])
def test_bad_backend_settings_are_named(text, message):
    recipe, issues = _validate(text)
    assert recipe is None and any(message in issue.message for issue in issues), issues

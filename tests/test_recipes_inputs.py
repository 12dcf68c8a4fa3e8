"""Damaged data files, unusable output folders and impossible sizes are refused
before any rank starts: exit code 2, the file, line and field named, nothing
launched and nothing written. The checks themselves (hvdkeras/recipes/data_checks.py)
are tested first on real files, damaged on purpose.
"""

from __future__ import annotations

import gzip
import os
import re
import textwrap

import pytest

from hvdkeras import cli
from hvdkeras.recipes import data as recipe_data
from hvdkeras.recipes import data_checks, data_files

CSV_HEAD = "a,b,label\n"


@pytest.fixture
def exports(tmp_path):
    tfrecord, csv = tmp_path / "digits.tfrecord", tmp_path / "digits.csv"
    assert recipe_data.export_digits(str(tfrecord), "tfrecord") == data_files.DIGITS_EXAMPLES
    assert recipe_data.export_digits(str(csv), "csv") == data_files.DIGITS_EXAMPLES
    return tfrecord, csv


def test_whole_files_are_counted(exports):
    tfrecord, csv = exports
    assert data_checks.check_tfrecord(str(tfrecord), "") == (data_files.DIGITS_EXAMPLES, None)
    assert data_checks.check_csv(str(csv), "", True, 65) == (data_files.DIGITS_EXAMPLES, None)
    bundled = str(data_files.DIGITS_FILE)
    assert data_checks.check_csv(bundled, "GZIP", False, 65) == (data_files.DIGITS_EXAMPLES, None)


def test_damaged_files_are_found(tmp_path, exports):
    tfrecord, csv = exports
    cut = tmp_path / "cut.tfrecord"
    cut.write_bytes(tfrecord.read_bytes()[:-5])
    count, problem = data_checks.check_tfrecord(str(cut), "")
    assert count is None and f"record {data_files.DIGITS_EXAMPLES} says it holds" in problem
    assert "truncated" in problem
    short = tmp_path / "short.csv"
    short.write_text(CSV_HEAD + "1,2,0\n3,4")
    assert data_checks.check_csv(str(short), "", True, 3)[1] == (
        f"{short}: line 3 has 2 column(s), the first line has 3; the file looks truncated or "
        "malformed")
    binary = tmp_path / "binary.csv"
    binary.write_bytes(CSV_HEAD.encode() + b"1,2,0\n" + bytes(range(256)) * 4 + b"\n")
    assert "holds binary bytes (at byte 16)" in data_checks.check_csv(str(binary), "", True, 3)[1]
    half = tmp_path / "half.csv.gz"
    whole = gzip.compress((CSV_HEAD + "".join(f"{i},{i * 7 % 13},{i % 10}\n"
                                              for i in range(5000))).encode())
    half.write_bytes(whole[:len(whole) // 2])
    assert "gzip stream is damaged or cut short" in data_checks.check_csv(str(half), "GZIP", True, 3)[1]


def test_output_folders(tmp_path):
    assert data_checks.writable_dir_problem(str(tmp_path / "new" / "deeper")) is None
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert data_checks.writable_dir_problem(str(blocker / "ck")) == (
        f"cannot create {blocker / 'ck'}: {blocker} is a file, not a folder")
    assert not (tmp_path / "new").exists()  # checking creates nothing


# --- end to end through `hvdkeras train --np 2` -------------------------------

@pytest.fixture
def no_launch(monkeypatch):
    calls = []
    import hvdkeras.recipes.launching as launching
    import hvdkeras.recipes.run as run

    monkeypatch.setattr(launching, "launch_ranks", lambda *a, **k: calls.append(a) or 0)
    monkeypatch.setattr(run, "train", lambda *a, **k: calls.append(a) or 0)
    return calls


def _recipe(data: str, extra: str = "") -> str:
    return textwrap.dedent("""\
        version: 1
        model: {name: "hvdkeras.recipes.models:mlp"}
        data:
        """) + textwrap.indent(textwrap.dedent(data), "  ") + textwrap.dedent(extra)


TFRECORD = """\
    source: tfrecord
    path: data.tfrecord
    features: {pixels: {shape: [64]}, label: {dtype: int64}}
    label: label
    num_classes: 10
"""
CSV = """\
    source: csv
    path: data.csv
    label: label
    num_classes: 10
"""


def _damage(tmp_path, exports, case):
    tfrecord, csv = exports
    if case == "truncated-csv":
        (tmp_path / "data.csv").write_bytes(csv.read_bytes()[:-7])
        return CSV, "", [r"data.path: .*data.csv: line 1798 has \d+ column\(s\), the first line has 65"]
    if case == "binary-csv":
        (tmp_path / "data.csv").write_bytes(csv.read_bytes() + b"\x00\x01\x02\n")
        return CSV, "", [r"data.path: .*data.csv holds binary bytes \(at byte \d+\)"]
    if case == "truncated-tfrecord":
        (tmp_path / "data.tfrecord").write_bytes(tfrecord.read_bytes()[:-100])
        return TFRECORD, "", [r"data.path: .*data.tfrecord: record 1797 says it holds"]
    if case == "checkpoint-dir-under-a-file":
        (tmp_path / "data.csv").write_bytes(csv.read_bytes())
        (tmp_path / "blocker").write_text("x")
        return CSV, f"checkpoint: {{dir: {tmp_path}/blocker/ck}}\n", [
            r"bad.yaml:\d+: checkpoint.dir: cannot create .*blocker/ck: .*blocker is a file"]
    if case == "batch-larger-than-the-shard":
        (tmp_path / "data.csv").write_bytes(csv.read_bytes())
        return CSV + "    batch_size: 1000\n", "", [
            r"bad.yaml:\d+: data.batch_size: 1000 per rank does not fit: 1797 training examples "
            r"over 2 rank\(s\) leave 898 on the smallest shard"]
    if case == "epochs-beyond-bounds":
        (tmp_path / "data.csv").write_bytes(csv.read_bytes())
        return CSV, "training: {epochs: 1000000000000000000000000000000}\n", [
            r"bad.yaml:\d+: training.epochs: 1000000000000000000000000000000 is out of range; "
            r"expected an integer >= 1 and <= 1000000$"]
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["truncated-csv", "binary-csv", "truncated-tfrecord",
                                  "checkpoint-dir-under-a-file", "batch-larger-than-the-shard",
                                  "epochs-beyond-bounds"])
def test_bad_inputs_stop_train_before_anything_starts(tmp_path, exports, capsys, no_launch, case):
    data, extra, expected = _damage(tmp_path, exports, case)
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(_recipe(data, extra))
    before = sorted(os.listdir(tmp_path))
    code = cli.main(["train", str(recipe), "--np", "2"])
    err = capsys.readouterr().err
    assert code == 2, err
    for pattern in expected:
        assert re.search(pattern, err, re.MULTILINE), f"{pattern!r} not in:\n{err}"
    assert no_launch == []
    assert sorted(os.listdir(tmp_path)) == before  # nothing written


def test_a_good_file_recipe_passes_and_launches(tmp_path, exports, capsys, no_launch):
    tfrecord, _ = exports
    os.replace(tfrecord, tmp_path / "data.tfrecord")
    recipe = tmp_path / "good.yaml"
    recipe.write_text(_recipe(TFRECORD, f"checkpoint: {{dir: {tmp_path}/new/ck}}\n"))
    assert cli.main(["train", str(recipe), "--np", "2"]) == 0, capsys.readouterr().err
    assert len(no_launch) == 1

"""Input pipelines of the recipes, one rank at a time (no MPI needed).

The bundled digits are also written out as TFRecord and CSV here; every file
source must yield exactly the examples the bundled source yields, on every
rank of a pretend 2-rank world, in the same order.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from hvdkeras.recipes import data as recipe_data
from hvdkeras.recipes import data_files, validation
from hvdkeras.recipes.yaml_source import apply_overrides, parse_text

BASE = """\
version: 1
model: {name: "hvdkeras.recipes.models:mlp"}
data:
  batch_size: 8
  shuffle: false
  validation: {split: 0.2}
"""


def _recipe(tmp_path, data_lines: str = "", overrides=()):
    text = BASE + textwrap.indent(textwrap.dedent(data_lines), "  ")
    doc = parse_text(text, "r.yaml")
    apply_overrides(doc, overrides)
    recipe, issues = validation.validate(doc, recipe_path=str(tmp_path / "r.yaml"), cwd=str(tmp_path))
    assert issues == [], [str(i) for i in issues]
    return recipe


def _all(dataset, batches=None):
    xs, ys = [], []
    for k, (x, y) in enumerate(dataset):
        if batches is not None and k >= batches:
            break
        xs.append(np.asarray(x).reshape(len(y), -1))
        ys.append(np.asarray(y))
    return np.concatenate(xs), np.concatenate(ys)


def test_validation_mask_is_exact_and_spread():
    mask = data_files.validation_mask(1797, 0.2)
    assert mask.sum() == 359
    assert data_files.validation_mask(10, 0.3).tolist() == [
        False, False, False, True, False, False, True, False, False, True]
    assert max(np.diff(np.flatnonzero(mask))) <= 5


def test_digits_file():
    x, y = data_files.load_digits()
    assert x.shape == (1797, 64) and y.shape == (1797,)
    assert x.min() == 0 and x.max() == 16
    assert sorted(set(y.tolist())) == list(range(10))


@pytest.mark.parametrize("rank", [0, 1])
def test_bundled_shards_and_split(tmp_path, rank):
    recipe = _recipe(tmp_path)
    built = recipe_data.build_data(recipe, rank, 2)
    assert (built.train_examples, built.validation_examples) == ((719, 180), (719, 179))[rank]
    assert built.input_shape == [8, 8, 1] and built.num_classes == 10
    x, y = next(iter(built.train))
    assert x.shape == (8, 8, 8, 1) and x.dtype.name == "float32" and y.dtype.name == "int32"
    assert 0.0 <= float(np.min(x)) and float(np.max(x)) <= 1.0
    xv, yv = _all(built.validation)
    assert len(yv) == built.validation_examples


def _exports(tmp_path):
    tfrecord = tmp_path / "digits.tfrecord"
    csv = tmp_path / "digits_header.csv"
    assert recipe_data.export_digits(str(tfrecord), "tfrecord") == 1797
    assert recipe_data.export_digits(str(csv), "csv") == 1797
    return tfrecord, csv


SOURCES = {
    "csv-gzip-bundled": """\
        source: csv
        path: "{bundled}/digits.csv.gz"
        header: false
        label: 64
        num_classes: 10
        scale: 0.0625
    """,
    "csv-header": """\
        source: csv
        path: digits_header.csv
        label: label
        num_classes: 10
        scale: 0.0625
    """,
    "tfrecord": """\
        source: tfrecord
        path: "*.tfrecord"
        features: {pixels: {shape: [64]}, label: {dtype: int64}}
        label: label
        num_classes: 10
        scale: 0.0625
    """,
}


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("rank", [0, 1])
def test_file_sources_yield_the_bundled_examples(tmp_path, source, rank):
    _exports(tmp_path)
    reference = recipe_data.build_data(_recipe(tmp_path, "layout: flat\n"), rank, 2)
    built = recipe_data.build_data(_recipe(tmp_path, SOURCES[source]), rank, 2)
    assert built.train_examples == reference.train_examples
    assert built.validation_examples == reference.validation_examples
    x, y = _all(built.train, batches=89)
    x_ref, y_ref = _all(reference.train, batches=89)
    np.testing.assert_allclose(x, x_ref, rtol=1e-6)
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_allclose(_all(built.validation)[0], _all(reference.validation)[0], rtol=1e-6)


def test_csv_columns_by_name_and_reshape(tmp_path):
    _exports(tmp_path)
    recipe = _recipe(tmp_path, """\
        source: csv
        path: digits_header.csv
        label: label
        columns: [p0, p1, p2, p3]
        input_shape: [2, 2]
        num_classes: 10
    """)
    built = recipe_data.build_data(recipe, 0, 1)
    x, _ = next(iter(built.train))
    assert x.shape == (8, 2, 2)
    assert built.input_shape == [2, 2]


def test_a_separate_validation_file(tmp_path):
    _exports(tmp_path)
    recipe = _recipe(tmp_path, """\
        source: tfrecord
        path: digits.tfrecord
        features: {pixels: {shape: [64]}, label: {dtype: int64}}
        num_classes: 10
    """, ["data.validation={path: digits.tfrecord}"])
    built = recipe_data.build_data(recipe, 0, 2)
    assert built.train_examples == 899 and built.validation_examples == 899


def test_function_source_gets_rank_and_size(tmp_path):
    recipe = _recipe(tmp_path, """\
        source: "recipe_helpers:squares_dataset"
        args: {count: 50}
        num_classes: 2
    """)
    built = recipe_data.build_data(recipe, 1, 2)
    # 50 examples, 10 held out, the rest split over 2 ranks.
    assert built.train_examples == 20 and built.validation_examples == 5
    assert built.input_shape == [1]


def test_synthetic_source(tmp_path):
    recipe = _recipe(tmp_path, """\
        source: synthetic
        input_shape: [4, 4, 3]
        num_classes: 7
        samples: 64
    """)
    built = recipe_data.build_data(recipe, 0, 2)
    x, y = next(iter(built.train))
    assert x.shape == (8, 4, 4, 3) and built.train_examples == 64
    assert int(np.max(y)) < 7
    assert built.validation_examples == 8  # 64 * 0.2 -> one batch


def test_csv_column_errors(tmp_path):
    _exports(tmp_path)
    recipe = _recipe(tmp_path, """\
        source: csv
        path: digits_header.csv
        label: digit
    """)
    with pytest.raises(data_files.DataError, match=r"data.label: no column named 'digit'"):
        recipe_data.build_data(recipe, 0, 1)


def test_compression_detection():
    assert data_files.compression_for("auto", ["a.csv.gz"]) == "GZIP"
    assert data_files.compression_for("auto", ["a.csv"]) == ""
    assert data_files.compression_for("zlib", ["a.csv"]) == "ZLIB"
    assert data_files.shard_size(1438, 1, 2) == 719

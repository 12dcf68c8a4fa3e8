"""The [io] extra: Parquet input through tensorflow-io (TF 2.16-2.17 only).

Skipped where tensorflow-io cannot work (the default TF 2.21 leg, where
test_recipes_schema.py checks the refusal message instead). The TensorFlow
versions leg, `scripts/test_tf_versions.sh`, runs this file in its
environment with TensorFlow 2.17.1 + tensorflow-io 0.37.1, where:

* the op library is built against TensorFlow 2.17 (the build follows the
  installed TensorFlow);
* digits written to Parquet files here (with pyarrow) read back exactly as
  the bundled digits do, sharded per rank;
* the bundled Parquet recipe trains on 2 ranks.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hvdkeras.recipes.resolve import tensorflow_io_problem

pytestmark = [pytest.mark.usefixtures("op_library_built"),
              pytest.mark.skipif(tensorflow_io_problem() is not None,
                                 reason=str(tensorflow_io_problem()))]

REPO = Path(__file__).resolve().parent.parent


def test_op_library_is_built_for_the_installed_tensorflow():
    import tensorflow as tf

    from hvdkeras.engine import build, toolchain

    info = toolchain.read_build_info(build.ensure_built())
    assert info.get("tf_version") == tf.__version__
    assert tf.__version__.startswith(("2.16.", "2.17."))


def _write_parquet_shards(directory: Path, parts: int = 3) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from hvdkeras.recipes.data_files import load_digits

    x, y = load_digits()
    bounds = np.linspace(0, len(y), parts + 1).astype(int)
    for k in range(parts):
        rows = slice(bounds[k], bounds[k + 1])
        columns = {f"p{i}": pa.array(x[rows, i]) for i in range(64)}
        columns["digit"] = pa.array(y[rows].astype(np.int64))
        pq.write_table(pa.table(columns), directory / f"part-{k}.parquet")


@pytest.mark.parametrize("rank", [0, 1])
def test_parquet_files_yield_the_bundled_examples(tmp_path, rank):
    from hvdkeras.recipes import data as recipe_data
    from hvdkeras.recipes import validation
    from hvdkeras.recipes.yaml_source import parse_text

    _write_parquet_shards(tmp_path)

    def build(data_text):
        doc = parse_text("version: 1\nmodel: {name: 'hvdkeras.recipes.models:mlp'}\n"
                         "data:\n  batch_size: 8\n  shuffle: false\n  validation: {split: 0.2}\n"
                         + data_text, "r.yaml")
        recipe, issues = validation.validate(doc, recipe_path=str(tmp_path / "r.yaml"))
        assert issues == []
        return recipe_data.build_data(recipe, rank, 2)

    reference = build("  layout: flat\n")
    built = build("  source: parquet\n  path: 'part-*.parquet'\n  label: digit\n"
                  "  num_classes: 10\n  scale: 0.0625\n")
    assert built.train_examples == reference.train_examples
    for (x, y), (x_ref, y_ref) in zip(built.train.take(89), reference.train.take(89)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(x_ref), rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(y_ref))


@pytest.mark.slow
@pytest.mark.timeout(660)
def test_parquet_recipe_trains_on_two_ranks(tmp_path):
    from recipe_helpers import train

    _, summary = train(REPO / "recipes" / "digits_parquet.yaml", "training.epochs=2",
                       summary=tmp_path / "summary.json", timeout=600)
    assert summary["epochs_run"] == 2 and summary["ranks"] == 2
    assert summary["train_examples_per_rank"] == 719
    assert summary["final"]["val_accuracy"] > 0.5

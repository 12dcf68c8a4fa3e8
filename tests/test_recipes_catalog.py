"""Validating a recipe without importing Keras: the catalogue of Keras names
(hvdkeras/recipes/keras_catalog.py) vouches for known names, and everything
else still gets Keras' own verdict.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from hvdkeras.recipes import keras_catalog, load_recipe

CATALOG = {"format": keras_catalog.FORMAT, "keras": "3.x",
           "models": {"ResNet50": ["weights", "classes"], "hvdkeras.recipes.models:mlp": ["hidden"],
                      "takes_anything": None},
           "optimizers": {"adam": ["learning_rate", "beta_1"]},
           "losses": ["sparse_categorical_crossentropy"], "metrics": ["accuracy"]}


def _recipe(model="ResNet50", model_args=None, optimizer="Adam", optimizer_args=None,
            loss="sparse_categorical_crossentropy", metrics=("accuracy",)):
    return {"model": {"name": model, "args": model_args or {}},
            "optimizer": {"name": optimizer, "args": optimizer_args or {}},
            "training": {"loss": loss, "metrics": list(metrics)}}


def test_the_catalogue_vouches_only_for_what_it_holds():
    assert keras_catalog.vouches_for(_recipe(), CATALOG)
    assert keras_catalog.vouches_for(_recipe(model_args={"weights": None}), CATALOG)
    assert keras_catalog.vouches_for(_recipe(model="takes_anything", model_args={"x": 1}), CATALOG)
    assert keras_catalog.vouches_for(_recipe(optimizer_args={"beta_1": 0.8}), CATALOG)
    for unknown in (_recipe(model="resnet50"), _recipe(model_args={"wieghts": None}),
                    _recipe(optimizer="Adamm"), _recipe(optimizer_args={"momentum": 0.9}),
                    _recipe(optimizer_args={"learning_rate": 0.1}),  # set by the recipe, not args
                    _recipe(loss="mse"), _recipe(loss={"name": "Huber", "args": {}}),
                    _recipe(metrics=("accuracy", "auc")), _recipe(model="pkg.mod:build")):
        assert not keras_catalog.vouches_for(unknown, CATALOG), unknown
    assert not keras_catalog.vouches_for(_recipe(), None)


def test_the_real_catalogue_holds_the_bundled_recipes_names(tmp_path, monkeypatch):
    monkeypatch.setenv("HVDKERAS_CACHE_DIR", str(tmp_path))
    catalog = keras_catalog.current()
    path = keras_catalog.catalog_path()
    assert path.exists() and json.loads(path.read_text()) == catalog
    assert "ResNet50" in catalog["models"] and "adam" in catalog["optimizers"]
    assert catalog["models"]["hvdkeras.recipes.models:mlp"] == sorted(
        ["input_shape", "num_classes", "hidden", "dropout", "activation", "normalize"])
    for name in ("digits", "tabular_mlp", "warmup_cosine", "resnet50_synthetic"):
        recipe, _ = load_recipe(name, environment=False)
        assert keras_catalog.vouches_for(recipe, catalog), name
    # A damaged file is made again.
    path.write_text("{not json")
    assert keras_catalog.current() == catalog


@pytest.mark.slow  # builds the catalogue in a process of its own
@pytest.mark.light
def test_validate_imports_no_keras_once_the_catalogue_exists(tmp_path):
    env = dict(os.environ, HVDKERAS_CACHE_DIR=str(tmp_path))
    code = ("import sys, time\n"
            "started = time.perf_counter()\n"
            "from hvdkeras.cli import main\n"
            "code = main(['validate', 'digits'])\n"
            "print('SECONDS', time.perf_counter() - started)\n"
            "print('IMPORTED', sorted(m for m in ('keras', 'tensorflow') if m in sys.modules))\n"
            "sys.exit(code)\n")
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    assert "IMPORTED ['keras', 'tensorflow']" in first.stdout  # made the catalogue
    started = time.perf_counter()
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                            timeout=300)
    took = time.perf_counter() - started
    assert second.returncode == 0, second.stderr
    assert "OK (digits-cnn" in second.stdout and "IMPORTED []" in second.stdout, second.stdout
    print(f"validate with the catalogue: {took:.2f} s for the whole process")

"""A cached catalogue of the Keras names recipes use, so that validating a
recipe need not import Keras (and TensorFlow) each time.

The catalogue lists what `resolve_keras` would accept: the model builders
(keras.applications and hvdkeras' own `hvdkeras.recipes.models` functions)
and optimizers with the keyword arguments they take, and the loss and metric
names. It is made once per Keras version and version of these sources (the
file name holds both), by importing Keras, and kept as JSON under the
hvdkeras cache directory.

It only ever vouches: `vouches_for` says True when every name and argument
of a recipe is in it, and anything else (a name it does not hold, arguments
to a loss or metric, a user's `module:function`) goes to `resolve_keras`,
which imports Keras and gives the verdict and the message. So a stale or
damaged catalogue can cost time, never a wrong answer about a name it lacks.

What may import this module: `hvdkeras.recipes.resolve` (it imports Keras
only to build the catalogue).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any, Dict, Optional

from hvdkeras.engine.toolchain import cache_root
from hvdkeras.recipes.user_code import keyword_parameters

_HERE = Path(__file__).resolve().parent
# The sources whose behaviour the catalogue records: a change to any makes a new one.
_SOURCES = ("keras_catalog.py", "keras_objects.py", "models.py", "resolve_keras.py", "user_code.py")
OWN_MODELS = "hvdkeras.recipes.models"
FORMAT = 1


def catalog_path() -> Optional[Path]:
    """Where the catalogue for the installed Keras and these sources lives (None: no Keras)."""
    try:
        version = importlib.metadata.version("keras")
    except importlib.metadata.PackageNotFoundError:
        return None
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((_HERE / name).read_bytes())
    return cache_root() / "recipes" / f"keras-{version}-{digest.hexdigest()[:16]}.json"


def _params(function: Any) -> Optional[list]:
    accepted = keyword_parameters(function)
    return None if accepted is None else sorted(accepted)


def build() -> Dict[str, Any]:
    """Makes the catalogue by looking everything up in Keras (imports it)."""
    import keras  # lazy: building is the one step here that needs Keras

    from hvdkeras.recipes import keras_objects, models  # lazy: both import Keras

    model_builders: Dict[str, Optional[list]] = {
        name: _params(getattr(keras.applications, name)) for name in models.application_names()}
    for name in models.BUILDERS:
        model_builders[f"{OWN_MODELS}:{name}"] = _params(getattr(models, name))
    losses, metrics = [], []
    for name in keras_objects.loss_names():
        try:
            keras_objects.make_loss(name)
            losses.append(name)
        except Exception:  # not a name keras.losses.get takes
            continue
    for name in keras_objects.metric_names():
        try:
            keras_objects.make_metric(name)
            metrics.append(name)
        except Exception:
            continue
    return {"format": FORMAT, "keras": keras.__version__, "models": model_builders,
            "optimizers": {key: _params(cls)
                           for key, cls in keras_objects.optimizer_classes().items()},
            "losses": sorted(losses), "metrics": sorted(metrics)}


def _save(path: Path, catalog: Dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(catalog), encoding="utf-8")
    os.replace(temporary, path)


def current() -> Optional[Dict[str, Any]]:
    """The catalogue for this environment, made (and saved) when missing; None when
    it can be neither read nor made (no Keras, an unwritable cache)."""
    path = catalog_path()
    if path is None:
        return None
    try:
        catalog = json.loads(path.read_text(encoding="utf-8"))
        if catalog.get("format") == FORMAT:
            return catalog
    except (OSError, ValueError):
        pass
    try:
        catalog = build()
    except Exception:  # Keras cannot be imported here: resolve_keras will say why
        return None
    try:
        _save(path, catalog)
    except OSError:
        pass  # still usable for this run
    return catalog


def _args_fit(args: dict, params: Optional[list], reserved: tuple = ()) -> bool:
    if any(key in reserved for key in args):
        return False
    return params is None or all(key in params for key in args)


def vouches_for(recipe: dict, catalog: Optional[Dict[str, Any]]) -> bool:
    """Whether every Keras name and argument in `recipe` is known good. Pure."""
    if not catalog:
        return False
    model = recipe["model"]
    if model["name"] not in catalog["models"] or not _args_fit(
            model["args"], catalog["models"][model["name"]]):
        return False
    optimizer = recipe["optimizer"]
    key = optimizer["name"].lower()
    if key not in catalog["optimizers"] or not _args_fit(
            optimizer["args"], catalog["optimizers"][key], reserved=("learning_rate",)):
        return False
    training = recipe["training"]
    if not isinstance(training["loss"], str) or training["loss"] not in catalog["losses"]:
        return False
    return all(isinstance(m, str) and m in catalog["metrics"] for m in training["metrics"])

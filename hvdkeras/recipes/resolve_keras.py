"""The recipe checks that look names up in Keras: the model (a
keras.applications name or a `module:function`) and its arguments, the
optimizer and its arguments, losses and metrics.

`hvdkeras.recipes.resolve` runs them only when the catalogue of Keras names
(`keras_catalog`) cannot vouch for the recipe, so a recipe of known names is
validated without importing Keras.

What may import this module: `hvdkeras.recipes.resolve`, lazily (it imports Keras).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import keras

from hvdkeras.recipes import keras_objects
from hvdkeras.recipes.models import application_names
from hvdkeras.recipes.spec import Context, did_you_mean
from hvdkeras.recipes.user_code import import_target, keyword_parameters
from hvdkeras.recipes.yaml_source import Path


def _check_args(function: Callable, args: dict, path: Path, out: Context, what: str,
                reserved: Iterable[str] = ()) -> None:
    accepted = keyword_parameters(function)
    if accepted is None:
        return
    accepted -= set(reserved)
    for key in args:
        if key not in accepted:
            out.error(path + (key,), f"{what} takes no argument {key!r}"
                                     f"{did_you_mean(key, accepted)}; it takes: "
                                     f"{', '.join(sorted(accepted))}")


def _check_model(recipe: dict, out: Context) -> None:
    name = recipe["model"]["name"]
    if ":" in name:
        function = import_target(name, ("model", "name"), out, "model.name")
    else:
        names = application_names()
        if name not in names:
            matches = [n for n in names if n.lower() == name.lower()]
            hint = f" (did you mean {matches[0]!r}?)" if matches else did_you_mean(name, names)
            out.error(("model", "name"), f"{name!r} is not a keras.applications model{hint}; "
                                         "use one of them (ResNet50, MobileNetV2, EfficientNetB0, "
                                         "...) or a 'module:function'")
            return
        function = getattr(keras.applications, name)
    if function is not None:
        _check_args(function, recipe["model"]["args"], ("model", "args"), out, name)


def _check_optimizer(recipe: dict, out: Context) -> None:
    opt = recipe["optimizer"]
    classes = keras_objects.optimizer_classes()
    cls = classes.get(opt["name"].lower())
    if cls is None:
        names = sorted(c.__name__ for c in classes.values())
        out.error(("optimizer", "name"), f"{opt['name']!r} is not a Keras optimizer"
                                         f"{did_you_mean(opt['name'], names)}; use one of "
                                         f"{', '.join(names)}")
        return
    _check_args(cls, opt["args"], ("optimizer", "args"), out, cls.__name__,
                reserved=("learning_rate",))


def _check_named(spec: Any, path: Path, out: Context, kind: str) -> None:
    make = keras_objects.make_loss if kind == "loss" else keras_objects.make_metric
    names = keras_objects.loss_names() if kind == "loss" else keras_objects.metric_names()
    name = spec if isinstance(spec, str) else spec["name"]
    where = path if isinstance(spec, str) else path + ("name",)
    try:
        make(spec)
    except TypeError as error:
        out.error(path + ("args",), f"bad arguments for {kind} {name!r}: {error}")
    except Exception:
        out.error(where, f"{name!r} is not a Keras {kind}{did_you_mean(name, names)}; see "
                         f"keras.{'losses' if kind == 'loss' else 'metrics'} for the names")


def check_names(recipe: dict, out: Context) -> None:
    """Reports every Keras name or argument of `recipe` that does not exist."""
    _check_model(recipe, out)
    _check_optimizer(recipe, out)
    _check_named(recipe["training"]["loss"], ("training", "loss"), out, "loss")
    for index, metric in enumerate(recipe["training"]["metrics"]):
        _check_named(metric, ("training", "metrics", index), out, "metric")

"""Building a recipe's model, and the small models the bundled recipes use.

`model.name` is a `keras.applications` name (ResNet50, MobileNetV2, ...) or a
`module:function` returning a Keras model. Arguments come from `model.args`;
where the function takes `input_shape` / `num_classes` (`classes` for the
applications) and the recipe does not set them, they come from the data
section. Applications default to `weights: null`: there is no network at run
time, and pretrained weights are a deliberate choice.

What may import this module: the rest of `hvdkeras.recipes`; recipes name its
model functions (`hvdkeras.recipes.models:digits_cnn`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Sequence

import keras

from hvdkeras.recipes.user_code import accepted_parameters, import_function

# The model builders of this module that recipes name as "hvdkeras.recipes.models:NAME".
BUILDERS = ("digits_cnn", "mlp")


def digits_cnn(input_shape: Sequence[int] = (8, 8, 1), num_classes: int = 10,
               filters: int = 32, dense: int = 128, dropout: float = 0.25):
    """A small CNN for 8x8 digit images (about 60k parameters).

    Example (in a recipe)::

        model: {name: "hvdkeras.recipes.models:digits_cnn", args: {filters: 32}}
    """
    layers = keras.layers
    return keras.Sequential([
        keras.Input(tuple(input_shape)),
        layers.Conv2D(filters, 3, padding="same", activation="relu"),
        layers.Conv2D(filters * 2, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dropout(dropout),
        layers.Dense(dense, activation="relu"),
        layers.Dense(num_classes),
        layers.Activation("softmax", dtype="float32"),  # float32 out under mixed precision
    ], name="digits_cnn")


def mlp(input_shape: Sequence[int] = (64,), num_classes: int = 10,
        hidden: Sequence[int] = (128, 64), dropout: float = 0.1, activation: str = "relu",
        normalize: bool = False):
    """A multi-layer perceptron for tabular rows (softmax output).

    Args:
        input_shape: Features per row.
        num_classes: Output classes.
        hidden: Units of each hidden layer.
        dropout: Dropout after each hidden layer.
        activation: Hidden activation.
        normalize: Batch-normalize the inputs first.
    """
    layers = keras.layers
    stack = [keras.Input(tuple(input_shape)), layers.Flatten()]
    if normalize:
        stack.append(layers.BatchNormalization())
    for units in hidden:
        stack.append(layers.Dense(int(units), activation=activation))
        if dropout:
            stack.append(layers.Dropout(dropout))
    stack += [layers.Dense(num_classes), layers.Activation("softmax", dtype="float32")]
    return keras.Sequential(stack, name="mlp")


def application_names() -> list:
    """The model constructors `keras.applications` offers (ResNet50, ...)."""
    return sorted(n for n in dir(keras.applications)
                  if n[:1].isupper() and callable(getattr(keras.applications, n)))


def model_function(recipe: dict) -> Callable[..., Any]:
    """The function that builds the recipe's model."""
    name = recipe["model"]["name"]
    if ":" in name:
        return import_function(name)
    return getattr(keras.applications, name)


def model_arguments(recipe: dict, function: Callable[..., Any]) -> Dict[str, Any]:
    """`model.args` plus what the data section implies (shape, classes, weights)."""
    args = dict(recipe["model"]["args"])
    data = recipe["data"]
    accepted = accepted_parameters(function)
    is_application = ":" not in recipe["model"]["name"]

    def offer(key: str, value: Any) -> None:
        if value is None or key in args:
            return
        if accepted is None and not is_application:
            return  # **kwargs: pass only what the user wrote
        if accepted is None or key in accepted:
            args[key] = value

    shape = data.get("input_shape")
    offer("input_shape", tuple(shape) if shape else None)
    offer("classes" if is_application else "num_classes", data.get("num_classes"))
    if is_application:
        args.setdefault("weights", None)
    return args


def build_model(recipe: dict):
    """Calls the model function with its arguments; checks a model came back."""
    function = model_function(recipe)
    model = function(**model_arguments(recipe, function))
    if not isinstance(model, keras.Model):
        raise TypeError(f"model.name {recipe['model']['name']!r} returned "
                        f"{type(model).__name__}, not a keras.Model")
    return model

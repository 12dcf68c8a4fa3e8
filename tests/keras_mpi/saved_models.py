"""The models that save_models.py writes and load_without_hvdkeras.py reads."""

import keras

# name -> (optimizer class name, inner optimizer class name or None, dtype policy)
EXPECTED = {
    "adam_clipnorm": ("Adam", None, "float32"),
    "mixed_float16": ("LossScaleOptimizer", "Adam", "mixed_float16"),
    "custom_subclass": ("ScaledSGD", None, "float32"),
}


def make_optimizer(name):
    from custom_optimizer import ScaledSGD

    if name == "custom_subclass":
        return ScaledSGD(0.05, boost=3.0, momentum=0.5)
    return keras.optimizers.Adam(0.01, global_clipnorm=1.0)


def make_model(name, seed):
    keras.utils.set_random_seed(seed)
    keras.config.set_dtype_policy(EXPECTED[name][2])
    try:
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                                 keras.layers.Dense(1, dtype="float32")])
    finally:
        keras.config.set_dtype_policy("float32")


def data(seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.normal(size=(8, 5)).astype("float32"), rng.normal(size=(8, 1)).astype("float32"))


def state(model):
    """Weights then optimizer variables, as numpy arrays."""
    import numpy as np

    return ([np.asarray(w) for w in model.get_weights()]
            + [np.asarray(keras.ops.convert_to_numpy(v)) for v in model.optimizer.variables])

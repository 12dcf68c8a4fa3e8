"""Loading a saved model ready to train on every rank (Horovod's `load_model`).

What may import this module: the top-level package.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import keras

from hvdkeras.collectives.compression import Compression, Compressor
from hvdkeras.training.optimizer import DistributedOptimizer


def load_model(filepath: str, custom_optimizers: Optional[Sequence[type]] = None,
               custom_objects: Optional[dict] = None,
               compression: Compressor = Compression.none) -> keras.Model:
    """Loads a `.keras` model and makes its optimizer distributed, state kept.

    The optimizer `model.save()` recorded (slots, iteration count, learning
    rate) is loaded as Keras loads it and converted in place by
    `DistributedOptimizer`, so `fit()` continues on every rank where the
    saved run stopped. Every rank reads the file: use a path all ranks see,
    or load on one and `hvd.broadcast_model(model)`.

    Args:
        filepath: The `.keras` file.
        custom_optimizers: Optimizer classes of your own that the file names.
        custom_objects: Other custom objects, as for `keras.models.load_model`.
        compression: The wire compression of the gradients' reduction.

    Returns:
        The compiled model, its optimizer distributed.

    Example:

    ```python
    model = hvd.load_model("checkpoints/epoch-00003.keras")
    model.fit(x, y, initial_epoch=3, epochs=10, callbacks=[...])
    ```
    """
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects)
    optimizer: Any = getattr(model, "optimizer", None)
    if optimizer is None:
        return model  # saved without compile(): nothing to distribute
    if DistributedOptimizer(optimizer, compression=compression) is not optimizer:
        raise ValueError(
            f"{filepath} holds an optimizer that needs a LossScaleOptimizer under the "
            "mixed_float16 policy; load it with keras.models.load_model and compile again "
            "with hvd.DistributedOptimizer(model.optimizer).")
    return model

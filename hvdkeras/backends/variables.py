"""Broadcasting Keras variables under any backend: their values travel as
host arrays (one request per dtype) and are assigned back through Keras.

The TensorFlow backend keeps its fused broadcast op (usable inside a
`tf.function`, `hvdkeras.collectives.broadcasting`); this is the path of the
others, where the broadcast runs between steps.

What may import this module: `hvdkeras.training` (model_sync), the callbacks.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import keras

from hvdkeras.engine.process_sets import ProcessSet
from hvdkeras.host import arrays


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0,
                        name: str = "hvdkeras_broadcast_variables",
                        process_set: Optional[ProcessSet] = None) -> None:
    """Every rank's `variables` take `root_rank`'s values.

    Args:
        variables: Keras variables, in the same order on every rank.
        root_rank: The rank whose values everyone receives.
        name: The name every rank gives this call.
        process_set: The ranks taking part (default all).

    Example:

    ```python
    broadcast_variables(model.variables, root_rank=0)
    ```
    """
    variables = list(variables)
    if not variables:
        return
    values = [keras.ops.convert_to_numpy(v.value) for v in variables]
    received = arrays.grouped_broadcast(values, root_rank, name, process_set)
    for variable, value in zip(variables, received):
        variable.assign(value)

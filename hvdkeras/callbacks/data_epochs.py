"""`DataEpochCallback`: hvdkeras's samplers told each epoch's number, so
their order changes every epoch (torch's `DistributedSampler.set_epoch`)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

import keras

from hvdkeras.inputs import epochs


class DataEpochCallback(keras.callbacks.Callback):
    """Calls `set_epoch(epoch)` on samplers at the start of every epoch.

    Without it a `DistributedSampler` draws the same permutation every
    epoch (torch's sampler has the same need). `standard_callbacks` includes
    it.

    Args:
        samplers: The samplers to tell (anything with `set_epoch`); default:
            every `hvdkeras.DistributedSampler` alive in this process.

    Example:

    ```python
    model.fit(loader, epochs=5, callbacks=[hvd.callbacks.DataEpochCallback()])
    ```
    """

    def __init__(self, samplers: Optional[Sequence[Any]] = None) -> None:
        super().__init__()
        self._samplers = None if samplers is None else list(samplers)

    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None:
        if self._samplers is None:
            epochs.set_epoch(epoch)
        else:
            for sampler in self._samplers:
                sampler.set_epoch(int(epoch))

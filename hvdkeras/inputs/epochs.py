"""Samplers whose epoch must follow `fit`'s: hvdkeras's `DistributedSampler`
registers itself here, and `hvdkeras.callbacks.DataEpochCallback` (in
`standard_callbacks`) tells each the epoch at its start, as
`torch.utils.data.DistributedSampler.set_epoch` needs to be told for a new
order every epoch. No framework.

What may import this module: the rest of `hvdkeras.inputs` and
`hvdkeras.callbacks`.
"""

from __future__ import annotations

import weakref
from typing import Any, List

_samplers: "weakref.WeakSet[Any]" = weakref.WeakSet()


def follow_epochs(sampler: Any) -> None:
    """Registers `sampler` (anything with `set_epoch(epoch)`) while it lives."""
    _samplers.add(sampler)


def set_epoch(epoch: int) -> List[Any]:
    """Calls `set_epoch(epoch)` on every registered sampler; returns them."""
    samplers = list(_samplers)
    for sampler in samplers:
        sampler.set_epoch(int(epoch))
    return samplers

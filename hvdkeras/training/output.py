"""Console output that stays readable with many ranks: rank 0 speaks, the
others stay quiet.

What may import this module: anything above `hvdkeras.engine`.
"""

from __future__ import annotations

import sys
from typing import Any

from hvdkeras.engine import world


def _rank() -> int:
    return world.rank() if world.is_initialized() else 0


def fit_verbose() -> int:
    """The `verbose=` value for `model.fit` on this rank.

    Returns:
        0 on every rank but 0; on rank 0, 1 (the live progress bar) when
        stdout is a terminal and 2 (one line per epoch) when it is a file or
        pipe, as in batch jobs, where the bar would print a line every 50 ms.

    Example:

    ```python
    model.fit(x, y, epochs=5, verbose=hvd.fit_verbose())
    ```
    """
    if _rank() != 0:
        return 0
    isatty = getattr(sys.stdout, "isatty", None)
    return 1 if isatty is not None and isatty() else 2


def print_rank0(*values: Any) -> None:
    """`print` on rank 0 only, prefixed with "hvdkeras: " and flushed."""
    if _rank() == 0:
        print("hvdkeras:", *values, flush=True)

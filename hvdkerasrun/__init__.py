"""Entry point of the ``hvdkerasrun`` console script (also ``python -m hvdkerasrun``).

The launcher lives in `hvdkeras.runner`; importing it (and `hvdkeras`)
imports no TensorFlow, so the launcher starts at once.
"""

from __future__ import annotations

from hvdkeras.runner.cli import main

__all__ = ["main"]

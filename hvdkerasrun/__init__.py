"""Entry point of the ``hvdkerasrun`` console script (also ``python -m hvdkerasrun``).

The launcher itself needs no TensorFlow, but importing anything under
``hvdkeras`` runs ``hvdkeras/__init__.py``, which imports TensorFlow (seconds
of start-up and a few log lines on every launch). So this entry point
registers the ``hvdkeras`` package without executing its ``__init__`` and
imports only the launcher's modules (``hvdkeras.runner.*``, ``hvdkeras.config``),
which use the standard library alone. The ranks import hvdkeras normally.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Optional, Sequence


def _register_light_package() -> None:
    if "hvdkeras" in sys.modules:
        return
    spec = importlib.util.find_spec("hvdkeras")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("hvdkeras is not installed")
    package = types.ModuleType("hvdkeras", "hvdkeras, registered without running its __init__")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__file__ = spec.origin
    package.__package__ = "hvdkeras"
    sys.modules["hvdkeras"] = package


def main(argv: Optional[Sequence[str]] = None) -> int:
    _register_light_package()
    from hvdkeras.runner.launch import main as launch_main

    return launch_main(argv)

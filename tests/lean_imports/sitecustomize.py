"""Start-up of the Python processes the tests launch: the packages that
TensorFlow and Keras import whenever they are installed, but that the launched
process will not use, are hidden or deferred.

See Note [lean imports in launched processes] in tests/mpi_runner.py, which
puts this folder on PYTHONPATH.
"""

import importlib.abc
import importlib.util
import os
import sys

# Imported at start-up only to be offered to code that never asks for them
# (jax: TensorFlow Lite's JAX converter; pandas: Keras's DataFrame inputs).
HIDDEN_UNDER_TENSORFLOW = ("jax", "pandas")
# Imported at start-up by Keras's image-gallery helper; the report draws
# with it, so it is loaded when first used instead.
DEFERRED = ("matplotlib.pyplot",)


class _DeferredFinder(importlib.abc.MetaPathFinder):
    """Gives the modules in DEFERRED a loader that runs them at first use."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in DEFERRED:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


def _install() -> None:
    if os.environ.get("HVDKERAS_TEST_LEAN_IMPORTS", "1") != "1":
        return
    if os.environ.get("KERAS_BACKEND", "tensorflow") == "tensorflow":
        for name in HIDDEN_UNDER_TENSORFLOW:
            sys.modules.setdefault(name, None)
    sys.meta_path.insert(0, _DeferredFinder())


_install()

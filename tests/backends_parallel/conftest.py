"""Per-rank pytest setup for the tests of Keras's other backends.

Each file here runs as its own pytest session on every rank of an `mpiexec`
job with KERAS_BACKEND=torch or jax (launched by tests/test_backends.py), so
the tests and their collectives run in the same order everywhere. A file
named after one backend skips itself under the other. The outer suite must
not collect these files itself.
"""

import os

import pytest

UNDER_MPI = os.environ.get("HVDKERAS_UNDER_MPI") == "1"

collect_ignore_glob = [] if UNDER_MPI else ["test_*.py"]


@pytest.fixture(scope="session", autouse=True)
def hvdkeras_world():
    """Starts hvdkeras once per rank for the session; stops it at the end."""
    if os.environ.get("KERAS_BACKEND") == "jax":
        import jax  # 64-bit types, which JAX leaves off by default, are tested too

        jax.config.update("jax_enable_x64", True)
    import hvdkeras

    hvdkeras.init()
    yield
    hvdkeras.shutdown()

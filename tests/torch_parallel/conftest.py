"""Per-rank pytest setup for the PyTorch-backend tests.

Each file here runs as its own pytest session on every rank of an `mpiexec`
job with KERAS_BACKEND=torch (launched by tests/test_torch_backend.py), so
the tests and their collectives run in the same order everywhere. The outer
suite must not collect these files itself.
"""

import os

import pytest

UNDER_MPI = os.environ.get("HVDKERAS_UNDER_MPI") == "1"

collect_ignore_glob = [] if UNDER_MPI else ["test_*.py"]


@pytest.fixture(scope="session", autouse=True)
def hvdkeras_world():
    """Starts hvdkeras once per rank for the session; stops it at the end."""
    import hvdkeras

    hvdkeras.init()
    yield
    hvdkeras.shutdown()

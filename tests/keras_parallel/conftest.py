"""Per-rank pytest setup for the Keras integration tests.

Each file here runs as its own pytest session on every rank of an
`mpiexec -n 2` job (launched by tests/test_keras_mpi.py), so the tests and
their collectives run in the same order everywhere. The outer suite must not
collect these files itself.
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
    if os.environ.get("HVDKERAS_TEST_DEVICE") == "GPU":  # tests/test_gpu.py
        hvdkeras.pin_gpu()
    yield
    hvdkeras.shutdown()


@pytest.fixture(autouse=True)
def float32_policy():
    """Every test starts and ends with the float32 dtype policy."""
    import keras

    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(scope="module", autouse=True)
def fresh_keras_names():
    """Each file starts from Keras's fresh naming state, as in a session of its
    own: the collectives of a distributed optimizer are named after it, and a
    test that builds more optimizers on one rank than on the other (loading a
    checkpoint, say) would otherwise leave later files' automatic names
    (`adam_14` here, `adam_15` there) different across ranks."""
    import keras

    keras.backend.clear_session()
    yield

"""Per-rank pytest setup: one hvdkeras world for the whole session.

Every rank runs this same session under mpiexec (see
tests/test_collectives_mpi.py), so the tests' collectives line up.
"""

import os

import pytest
import tensorflow as tf

import hvdkeras


@pytest.fixture(scope="session", autouse=True)
def hvdkeras_world():
    """Starts hvdkeras once per rank; stops it when the session ends.

    Tests may shut hvdkeras down and start it again (test_errors.py does, last
    thing); shutdown() is a no-op when not initialized, so this teardown is
    safe either way.
    """
    hvdkeras.init()
    if os.environ.get("HVDKERAS_TEST_DEVICE") == "GPU":  # tests/test_gpu.py
        hvdkeras.pin_gpu()
    expected = os.environ.get("HVDKERAS_EXPECTED_SIZE")
    assert expected is None or hvdkeras.size() == int(expected), (
        f"launched as {expected} ranks, but hvdkeras sees a world of {hvdkeras.size()}")
    yield
    hvdkeras.shutdown()


@pytest.fixture(autouse=True)
def ranks_in_step(request):
    """After each test, all ranks meet in a collective named after that test.

    Tests reuse names (default op names, eager names), so a collective that
    one rank skipped (say, pruned from its graph) could otherwise pair up with
    the same name in a later test and hide the bug. With this barrier the
    ranks cannot drift apart: a leftover collective stalls instead (and
    HVDKERAS_STALL_SHUTDOWN_SECONDS, set by the launcher, turns the stall into
    an error naming the missing ranks).
    """
    yield
    if hvdkeras.is_initialized():
        done = hvdkeras.allreduce(tf.constant(1), op=hvdkeras.Sum,
                                  name=f"end of {request.node.nodeid}")
        assert int(done) == hvdkeras.size()

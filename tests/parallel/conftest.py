"""Per-rank pytest setup: one hvdkeras world for the whole session.

Every rank runs this same session under mpiexec (see
tests/test_collectives_mpi.py), so the tests' collectives line up.
"""

import os
from collections import defaultdict

import pytest
import tensorflow as tf

import hvdkeras
from case_sampling import pairwise_keep

# Note [pairwise cases]
# ~~~~~~~~~~~~~~~~~~~~~
# The suite's largest tests run a product of dtypes, shapes, ops, roots and
# modes (240 cases for the allreduce alone). At 1 to 3 ranks on one host
# (tests/test_collectives_mpi.py) the whole product runs. The jobs whose
# subject is where the ranks are (simulated hosts, 8 and more ranks, lab
# hosts) set HVDKERAS_PAIRWISE_CASES=1 and run a pairwise subset of each
# such test instead (tests/case_sampling.py): every two parameters' values
# still meet in some case, so a dtype on every path, every op at every
# shape, every root with every dtype still run there. Every rank collects
# the same cases in the same order and so keeps the same ones: the choice
# reads only which values are equal, never what their labels say.
PAIRWISE = os.environ.get("HVDKERAS_PAIRWISE_CASES") == "1"


def pytest_collection_modifyitems(config, items):
    if not PAIRWISE:
        return
    by_test = defaultdict(list)
    for item in items:
        if hasattr(item, "callspec"):
            by_test[(item.path, item.originalname)].append(item)
    dropped = []
    for cases in by_test.values():
        keep = pairwise_keep([{name: repr(value) for name, value in c.callspec.params.items()}
                              for c in cases])
        dropped += [c for c, kept in zip(cases, keep) if not kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(map(id, dropped))
        items[:] = [i for i in items if id(i) not in gone]


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

"""The other Keras backends in the main suite: their collectives, exact per
rank, on 2 real ranks under torch and under jax. The rest of their tests
(3 ranks, training, the quickstart, recipes) is tests/test_backends.py, the
CI leg that runs when the time budget allows (scripts/test.sh)."""

from __future__ import annotations

import pytest

from mpi_runner import assert_every_rank_passed, run_pytest_under_mpi
from test_backends import PARALLEL, TIMEOUT, backend_env

COLLECTIVES = next(p for p in PARALLEL if p.name == "test_backend_collectives.py")

pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow]


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_backend_collectives_on_two_ranks(backend):
    result, reports = run_pytest_under_mpi(
        2, COLLECTIVES, timeout=TIMEOUT, env=backend_env(backend),
        extra_args=["-rfE", "-W", "ignore::DeprecationWarning"])
    assert_every_rank_passed(2, result, reports)

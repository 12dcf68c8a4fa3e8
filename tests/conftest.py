"""Shared pytest setup for the whole suite.

`tests/parallel/` holds test files that must run on every rank of an MPI job
(each rank runs the same pytest session, so the collectives line up). The
outer suite launches them through `tests/test_collectives_mpi.py`; it must not
collect them itself. Inside such a job `HVDKERAS_UNDER_MPI=1` is set.
"""

import os

import pytest

from hvdkeras.engine import build

UNDER_MPI = os.environ.get("HVDKERAS_UNDER_MPI") == "1"

collect_ignore_glob = [] if UNDER_MPI else ["parallel/*"]


@pytest.fixture(scope="session")
def op_library_built():
    """Builds the op library once, up front, so no MPI job spends its time compiling."""
    build.ensure_built()

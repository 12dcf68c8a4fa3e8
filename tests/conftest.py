"""Shared pytest setup for the whole suite.

`tests/parallel/` holds test files that must run on every rank of an MPI job
(each rank runs the same pytest session, so the collectives line up). The
outer suite launches them through `tests/test_collectives_mpi.py`; it must not
collect them itself. Inside such a job `HVDKERAS_UNDER_MPI=1` is set, and
each rank's session writes its outcome to a file of its own (see Note [one
file per rank] in mpi_runner.py).
"""

import json
import os
from pathlib import Path

import pytest

from hvdkeras.engine import build
from hvdkeras.runner.rank_shim import rank_from_env
from mpi_runner import RANK_REPORT_DIR

UNDER_MPI = os.environ.get("HVDKERAS_UNDER_MPI") == "1"

collect_ignore_glob = [] if UNDER_MPI else ["parallel/*"]


@pytest.fixture(scope="session")
def op_library_built():
    """Builds the op library once, up front, so no MPI job spends its time compiling."""
    build.ensure_built()


def pytest_sessionfinish(session, exitstatus):
    """In a per-rank session, writes this rank's outcome to <report dir>/rank<N>.json."""
    directory = os.environ.get(RANK_REPORT_DIR)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not directory or reporter is None:
        return
    rank = rank_from_env()
    counts = {kind: len(reporter.stats.get(kind, []))
              for kind in ("passed", "failed", "skipped")}
    counts["errors"] = len(reporter.stats.get("error", []))
    report = {"rank": int(rank), "exitstatus": int(exitstatus), **counts}
    path = Path(directory, f"rank{rank}.json")
    path.with_suffix(".tmp").write_text(json.dumps(report))
    path.with_suffix(".tmp").replace(path)

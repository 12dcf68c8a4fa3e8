"""Every program in docs/custom-loops.md runs as written, at 2 ranks, under
the backends its `<!-- run: ... -->` line names, and every rank ends with the
same weights (the programs' `model`).

All programs of one backend run in one job (`tests/scripts/doc_programs.py`
runs each in a namespace of its own), so each backend costs one job start.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from mpi_runner import describe, run_under_mpi

TESTS = Path(__file__).resolve().parent
DOC = TESTS.parent / "docs" / "custom-loops.md"
RUNNER = TESTS / "scripts" / "doc_programs.py"
BLOCK = re.compile(r"<!-- run: ([a-z ]+) -->\n```python\n(.*?)```", re.DOTALL)
FRAMEWORK = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}


def programs():
    """(backend, title, source) for every program of the page."""
    text = DOC.read_text()
    found = []
    for match in BLOCK.finditer(text):
        heading = [line for line in text[:match.start()].splitlines() if line.startswith("## ")]
        for backend in match.group(1).split():
            found.append((backend, heading[-1][3:], match.group(2)))
    return found


def test_the_page_has_programs_for_every_backend():
    backends = {backend for backend, _, _ in programs()}
    assert backends == {"tensorflow", "jax", "torch"}
    assert len(programs()) >= 10


@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.usefixtures("op_library_built")
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_the_programs_run_and_end_with_the_same_weights_on_every_rank(backend, tmp_path):
    if importlib.util.find_spec(FRAMEWORK[backend]) is None:
        pytest.skip(f"{backend} is not installed: pip install -e '.[{backend}]'")
    chosen = [(title, source) for b, title, source in programs() if b == backend]
    listing = tmp_path / "programs.json"
    listing.write_text(json.dumps(chosen))
    result = run_under_mpi(2, [str(RUNNER), str(listing)], timeout=360,
                           env={"KERAS_BACKEND": backend,
                                "HVDKERAS_STALL_SHUTDOWN_SECONDS": "120"})
    assert result.returncode == 0, describe(result)
    for title, _ in chosen:
        for rank in result.ranks:
            assert f"program ok: {title}" in rank.stdout, describe(result)

"""The documentation site builds in strict mode (a broken link, a missing
anchor, a docstring mkdocstrings cannot read fail it), the recipe schema page
is generated from the schema, and the README's links lead to pages that
exist.

Runs the real `mkdocs build --strict` (the `docs` extra) into a temporary
directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdkeras.recipes.schema import RECIPE

# One process each (the `light` marker: pyproject.toml).
pytestmark = pytest.mark.light

REPO = Path(__file__).resolve().parent.parent
MKDOCS = [sys.executable, "-m", "mkdocs", "build", "--strict"]
TIMEOUT = 300
PAGES = ["index", "keras-training", "memory-scaling", "backends", "using-it", "recipes", "recipe-schema", "launching", "gpus",
         "fault-tolerance", "performance", "coming-from-horovod", "how-it-works",
         "architecture", "testing", "reference"]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*MKDOCS, "-f", str(config), "-d", str(site)], capture_output=True,
                          text=True, timeout=TIMEOUT, cwd=config.parent,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_site_builds_strict_with_every_page(tmp_path):
    result = _build(REPO / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-5000:]
    for page in PAGES:
        assert (tmp_path / "site" / ("" if page == "index" else page) / "index.html").is_file(), page
    schema = (tmp_path / "site" / "recipe-schema" / "index.html").read_text()
    assert "<!-- recipe-schema -->" not in schema  # replaced by the tables
    for key in RECIPE.fields:
        assert f"<code>{key}</code>" in schema, key
    assert "<code>callbacks.tensorboard</code>" in schema
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    for name in ("hvdkeras.engine.world.init", "hvdkeras.collectives.reduction.allreduce",
                 "hvdkeras.training.optimizer.DistributedOptimizer",
                 "hvdkeras.engine.stats.engine_stats", "hvdkeras.report.writer.write_report"):
        assert f'id="{name}"' in reference, name


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The check above could fail: a copy of the site with one broken link
    does not build."""
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "docs_hooks.py", tmp_path / "scripts" / "docs_hooks.py")
    gpus = tmp_path / "docs" / "gpus.md"
    gpus.write_text(gpus.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    result = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0 and "no-such-page.md" in result.stderr, result.stderr[-3000:]


def test_readme_links_lead_to_existing_files():
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#]+)\)", readme)
    assert targets, "the README links to the documentation"
    missing = [t for t in targets if not t.startswith("http") and not (REPO / t).exists()]
    assert missing == []

"""Packaging hook: ship the C++ op sources inside the wheel.

The op library is compiled on the user's machine (against the TensorFlow and
MPI found there), so a wheel must carry the sources. ``ops/`` lives at the
repository root; for a regular (non-editable) build it is copied into
``<build_lib>/hvdkeras/_ops_src/``. Editable installs read ``<repo>/ops``
directly and skip the copy.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

REPO_ROOT = Path(__file__).resolve().parent
OPS_DIR = REPO_ROOT / "ops"
# Everything under ops/ ships except build products, so the wheel cannot miss
# a kind of source file the build reads (hvdkeras.engine.toolchain decides
# which files those are).
BUILD_PRODUCT_SUFFIXES = (".o", ".so", ".a")


def _is_op_source(path: Path) -> bool:
    """Whether ``path`` is a file of the op sources that belongs in the wheel."""
    return (path.is_file() and path.suffix not in BUILD_PRODUCT_SUFFIXES
            and "__pycache__" not in path.parts)


class BuildPyWithOpSources(build_py):
    """``build_py`` that also copies ``ops/`` to ``hvdkeras/_ops_src/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        self._copy_op_sources(Path(self.build_lib) / "hvdkeras" / "_ops_src")

    def _copy_op_sources(self, target: Path) -> None:
        if not OPS_DIR.is_dir():
            raise RuntimeError(f"op sources not found at {OPS_DIR}")
        if target.exists():
            shutil.rmtree(target)
        for source in sorted(OPS_DIR.rglob("*")):
            if _is_op_source(source):
                destination = target / source.relative_to(OPS_DIR)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)


setup(cmdclass={"build_py": BuildPyWithOpSources})

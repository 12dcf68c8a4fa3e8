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
SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")


def _is_op_source(path: Path) -> bool:
    """Whether ``path`` is a C++/CUDA source file that belongs in the wheel."""
    return path.is_file() and path.suffix in SOURCE_SUFFIXES


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

"""Unpacks the wheels of a folder that fit this Python into a target folder
(for PYTHONPATH), without pip and without a network: on a lent GPU machine,
the wheels scripts/device_wheels.sh downloaded. A wheel fits when its tags
are pure Python or this CPython on x86-64 Linux; the newest fitting version
of each project wins. Packages this Python already has are left out.

    python3 scripts/unpack_wheels.py WHEEL_FOLDER TARGET_FOLDER

Prints what it unpacked.
"""

from __future__ import annotations

import importlib.util
import sys
import zipfile
from pathlib import Path

# Import names of the projects whose wheel names differ from them.
IMPORT_NAMES = {"absl_py": "absl", "markdown_it_py": "markdown_it", "pyyaml": "yaml",
                "nvidia_ml_py": "pynvml", "typing_extensions": "typing_extensions"}


def fits(filename: str) -> bool:
    """Whether a wheel file's tags fit this interpreter."""
    python, abi, platform = filename[:-len(".whl")].split("-")[-3:]
    if platform == "any":
        return True
    this = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return this in python.split(".") and "x86_64" in platform and "linux" in platform


def main(source: Path, target: Path) -> None:
    chosen: dict[str, Path] = {}
    for wheel in sorted(source.glob("*.whl")):
        project = wheel.name.split("-")[0].lower()
        if fits(wheel.name):
            chosen[project] = wheel  # sorted: a later (newer) version replaces an older one
    target.mkdir(parents=True, exist_ok=True)
    for project, wheel in sorted(chosen.items()):
        module = IMPORT_NAMES.get(project, project)
        if importlib.util.find_spec(module) is not None:
            print(f"kept this Python's {module}")
            continue
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
        print(f"unpacked {wheel.name}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))

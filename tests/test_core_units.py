"""Builds and runs the C++ unit tests of the engine's pure logic, one binary per unit.

Each `ops/tests/test_<unit>.cc` is linked with the shared harness
(`ops/tests/harness.cc`) and with only the core sources its unit needs
(`UNITS`), with a poisoned `mpi.h` first on the include path: a passing
build also proves that those sources need neither MPI nor TensorFlow. The
objects are compiled once per session, in parallel; every unit is then its
own test, so a failure names its unit.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
OPS = REPO_ROOT / "ops"
# Unit -> the core sources (ops/core/<name>.cc) its test links with.
UNITS: Dict[str, Tuple[str, ...]] = {
    "allreduce_path": ("allreduce_path",),
    "autotuner": ("autotuner",),
    "block_pool": ("block_pool",),
    "burst_memory": ("burst_memory",),
    "common": ("common",),
    "device_packing": ("device_packing",),
    "coordinator": ("coordinator", "request_validation", "request_digest", "message", "common"),
    "engine_settings": ("engine_settings",),
    "fusion_planner": ("fusion_planner", "common"),
    "half": (),
    "liveness_links": ("liveness", "liveness_links", "liveness_rules"),
    "liveness_rules": ("liveness_rules",),
    "message": ("message", "common"),
    "range_allocator": ("range_allocator",),
    "reduce_kernels": ("reduce_kernels",),
    "response_cache": ("response_cache", "message", "common"),
    "ring_plan": ("ring_plan",),
    "scaling": ("scaling", "common"),
    "submission_queue": ("submission_queue", "message", "common"),
    "request_digest": ("request_digest", "message", "common"),
    "virtual_ranks": ("virtual_ranks", "negotiation", "negotiation_requests", "coordinator",
                      "request_validation",
                      "request_digest", "response_cache", "message", "common", "scaling",
                      "timeline", "liveness_rules"),
    "wire_order": ("wire_order",),
}
COMPILE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 120
FLAGS = ("-std=c++17", "-O1", "-Wall", "-Wextra")
SANITIZER_FLAGS = ("-O0", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
                   "-fno-omit-frame-pointer")


def test_every_unit_test_file_is_listed():
    """A new ops/tests/test_*.cc cannot be forgotten by the table above."""
    found = {p.stem[len("test_"):] for p in (OPS / "tests").glob("test_*.cc")}
    assert found == set(UNITS)


def _gxx() -> str:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed; the C++ unit tests need it")
    return gxx


def _run_tool(command: List[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    assert result.returncode == 0, (f"building the C++ unit tests failed (exit "
                                    f"{result.returncode}):\n$ {' '.join(command)}\n"
                                    f"{result.stdout}{result.stderr}")
    return result


class UnitBuilds:
    """Compiles every source once (in parallel) and links one binary per unit."""

    def __init__(self, directory: Path, extra_flags: Tuple[str, ...]) -> None:
        self.gxx = _gxx()
        poison = directory / "poison"
        poison.mkdir()
        (poison / "mpi.h").write_text(
            '#error "the engine core logic must build without MPI: something included mpi.h"\n')
        self.flags = [*FLAGS, *extra_flags, f"-I{poison}", f"-I{OPS}"]
        self.directory = directory
        sources = {OPS / "tests" / "harness.cc"}
        for unit, core in UNITS.items():
            sources.add(OPS / "tests" / f"test_{unit}.cc")
            sources.update(OPS / "core" / f"{name}.cc" for name in core)
        self.objects = {source: directory / f"{source.parent.name}__{source.stem}.o"
                        for source in sorted(sources)}
        commands = [[self.gxx, *self.flags, "-c", str(s), "-o", str(o)]
                    for s, o in self.objects.items()]
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(_run_tool, commands))
        diagnostics = "".join(r.stdout + r.stderr for r in results).strip()
        if diagnostics:
            print(f"compiler diagnostics:\n{diagnostics}")

    def run(self, unit: str) -> str:
        """Links and runs the unit's binary; returns its output."""
        objects = [self.objects[OPS / "tests" / "harness.cc"],
                   self.objects[OPS / "tests" / f"test_{unit}.cc"],
                   *(self.objects[OPS / "core" / f"{name}.cc"] for name in UNITS[unit])]
        exe = self.directory / f"test_{unit}"
        _run_tool([self.gxx, *self.flags, *map(str, objects), "-o", str(exe)])
        try:
            proc = subprocess.run([str(exe)], capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{exe.name} did not finish in {RUN_TIMEOUT_S} s; output so far:\n"
                        f"{e.stdout or ''}{e.stderr or ''}")
        output = proc.stdout + proc.stderr
        print(output)
        assert proc.returncode == 0, f"{exe.name} exited with {proc.returncode}:\n{output}"
        assert " 0 failures" in proc.stdout and "[FAIL]" not in proc.stdout, output
        return output


@pytest.fixture(scope="module")
def builds(tmp_path_factory) -> UnitBuilds:
    return UnitBuilds(tmp_path_factory.mktemp("core_units"), ())


@pytest.mark.slow
@pytest.mark.parametrize("unit", sorted(UNITS))
def test_unit(builds: UnitBuilds, unit: str):
    builds.run(unit)


def _sanitizers_work(gxx: str, tmp_path: Path) -> bool:
    probe = tmp_path / "probe.cc"
    probe.write_text("int main() { return 0; }\n")
    proc = subprocess.run(
        [gxx, "-fsanitize=address,undefined", str(probe), "-o", str(tmp_path / "probe")],
        capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S,
    )
    return proc.returncode == 0 and subprocess.run(
        [str(tmp_path / "probe")], capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="module")
def sanitized_builds(tmp_path_factory) -> UnitBuilds:
    directory = tmp_path_factory.mktemp("core_units_sanitized")
    if not _sanitizers_work(_gxx(), directory):
        pytest.skip("g++ here cannot build with -fsanitize=address,undefined")
    # -O0 (after the default -O1): sanitized optimized builds compile slowly.
    return UnitBuilds(directory, SANITIZER_FLAGS)


@pytest.mark.slow
@pytest.mark.parametrize("unit", sorted(UNITS))
def test_unit_under_sanitizers(sanitized_builds: UnitBuilds, unit: str):
    """The same tests with AddressSanitizer and UBSan: any UB is a failure."""
    sanitized_builds.run(unit)

"""Builds and runs the C++ unit tests of the engine's pure logic.

`ops/tests/test_core_logic.cc` covers fusion planning, the response cache,
the coordinator (readiness, join, stalls and its validation messages), the
wire encoding, scaling and the float16/bfloat16 conversions. It is compiled
here together with only the framework-free, MPI-free core sources, with a
poisoned `mpi.h` first on the include path, so a passing build also proves
those files need neither TensorFlow nor MPI.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
OPS = REPO_ROOT / "ops"
TEST_SOURCE = OPS / "tests" / "test_core_logic.cc"
# The sources under test: everything the logic needs and nothing that talks
# to MPI (mpi_context.cc, engine.cc, ...) or TensorFlow (ops/tf).
CORE_SOURCES = [
    "common.cc",
    "message.cc",
    "coordinator.cc",
    "response_cache.cc",
    "fusion_planner.cc",
    "scaling.cc",
    "block_pool.cc",
    "reduce_kernels.cc",
]
COMPILE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 120


def _gxx() -> str:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed; the C++ core tests need it")
    return gxx


def _poison_headers(root: Path) -> Path:
    """An include dir whose mpi.h fails the build if anything includes it."""
    poison = root / "poison"
    poison.mkdir()
    (poison / "mpi.h").write_text(
        '#error "the engine core logic must build without MPI: something included mpi.h"\n'
    )
    return poison


def _compile(tmp_path: Path, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compiles each source to an object (in parallel), then links them."""
    gxx = _gxx()
    sources = [TEST_SOURCE, *(OPS / "core" / name for name in CORE_SOURCES)]
    missing = [str(p) for p in sources if not p.is_file()]
    assert not missing, f"sources not found: {missing}"
    flags = ["-std=c++17", "-O1", "-Wall", f"-I{_poison_headers(tmp_path)}", f"-I{OPS}",
             *extra_flags]
    objects = [tmp_path / f"{src.stem}.o" for src in sources]
    exe = tmp_path / "test_core_logic"

    def run(cmd: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
        return cmd, subprocess.run(cmd, capture_output=True, text=True,
                                   timeout=COMPILE_TIMEOUT_S)

    commands = [[gxx, *flags, "-c", str(src), "-o", str(obj)]
                for src, obj in zip(sources, objects)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(run, commands))
    results.append(run([gxx, *flags, *map(str, objects), "-o", str(exe)]))
    diagnostics = ""
    for cmd, proc in results:
        diagnostics += proc.stdout + proc.stderr
        assert proc.returncode == 0, (
            f"building the core logic tests failed (exit {proc.returncode}):\n"
            f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}"
        )
    if diagnostics.strip():
        print(f"compiler diagnostics:\n{diagnostics}")
    return exe


def _run(exe: Path) -> None:
    try:
        proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{exe.name} did not finish in {RUN_TIMEOUT_S} s; output so far:\n"
                    f"{e.stdout or ''}{e.stderr or ''}")
    output = proc.stdout + proc.stderr
    print(output)
    assert proc.returncode == 0, f"{exe.name} exited with {proc.returncode}:\n{output}"
    assert " 0 failures" in proc.stdout, output


def test_core_logic(tmp_path):
    _run(_compile(tmp_path))


def _sanitizers_work(gxx: str, tmp_path: Path) -> bool:
    probe = tmp_path / "probe.cc"
    probe.write_text("int main() { return 0; }\n")
    proc = subprocess.run(
        [gxx, "-fsanitize=address,undefined", str(probe), "-o", str(tmp_path / "probe")],
        capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S,
    )
    return proc.returncode == 0 and subprocess.run(
        [str(tmp_path / "probe")], capture_output=True, timeout=60).returncode == 0


@pytest.mark.slow
def test_core_logic_under_sanitizers(tmp_path):
    """The same tests with AddressSanitizer and UBSan: any UB is a failure."""
    if not _sanitizers_work(_gxx(), tmp_path):
        pytest.skip("g++ here cannot build with -fsanitize=address,undefined")
    # -O0 (after the default -O1): sanitized optimized builds compile slowly.
    _run(_compile(tmp_path, ("-O0", "-fsanitize=address,undefined",
                             "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer")))

"""Builds and runs the C++ unit tests of the autotuner's pure logic.

`ops/tests/test_autotuner.cc` drives `ops/core/autotuner.cc` with a simulated
clock: the threshold grid is searched first, then the cycle times at the
best threshold; fixed parameters are not searched; the best score wins;
done() after the plan; each trial's result is reported. It is compiled with
autotuner.cc only and a poisoned `mpi.h` first on the include path, so a
passing build also proves the tuner needs neither MPI nor TensorFlow.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
OPS = REPO_ROOT / "ops"
SOURCES = [OPS / "tests" / "test_autotuner.cc", OPS / "core" / "autotuner.cc"]
COMPILE_TIMEOUT_S = 300
RUN_TIMEOUT_S = 60


def test_autotuner_logic(tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed; the C++ autotuner tests need it")
    poison = tmp_path / "poison"
    poison.mkdir()
    (poison / "mpi.h").write_text('#error "the autotuner must build without MPI"\n')
    exe = tmp_path / "test_autotuner"
    cmd = [gxx, "-std=c++17", "-O1", "-Wall", "-Wextra", f"-I{poison}", f"-I{OPS}",
           *map(str, SOURCES), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    assert build.returncode == 0, f"$ {' '.join(cmd)}\n{build.stdout}{build.stderr}"
    if (build.stdout + build.stderr).strip():
        print(f"compiler diagnostics:\n{build.stdout}{build.stderr}")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = proc.stdout + proc.stderr
    print(output)
    assert proc.returncode == 0, output
    assert " 0 failures" in proc.stdout and "FAIL" not in proc.stdout, output

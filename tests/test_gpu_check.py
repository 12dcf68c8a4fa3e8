"""scripts/gpu_check.sh, the one command for a lent GPU machine, and the
CUDA device check it builds (ops/tests/gpu/cuda_device_check.cc).

Here (no GPU) the script must say so in one line and exit 0 quickly, and
the check must still build from the engine's sources and say why it has no
GPU. Where a GPU is present the check runs for real (scripts/gpu_check.sh
quotes it; tests/test_gpu.py has the framework-level GPU tests).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _has_gpu() -> bool:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return False
    listed = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=60)
    return listed.returncode == 0 and "GPU" in listed.stdout


@pytest.mark.timeout(120)
def test_without_a_gpu_the_script_says_so_in_one_line_and_exits_0():
    if _has_gpu():
        pytest.skip("this machine has a GPU: run `bash scripts/gpu_check.sh` and quote it")
    start = time.monotonic()
    result = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")],
                            capture_output=True, text=True, timeout=90)
    took = time.monotonic() - start
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and "no GPU" in lines[0], result.stdout
    assert result.stderr == ""
    assert took < 60


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_cuda_device_check_builds_and_runs(tmp_path):
    built = subprocess.run([sys.executable, str(REPO / "scripts" / "build_cuda_device_check.py"),
                            str(tmp_path)], capture_output=True, text=True, timeout=540)
    if built.returncode == 2:
        pytest.skip(f"no CUDA or NCCL headers here: {built.stderr.strip()}")
    assert built.returncode == 0, built.stdout + built.stderr
    binary = Path(built.stdout.strip().splitlines()[-1])
    assert binary.is_file()
    ran = subprocess.run([str(binary), str(tmp_path / "kernel_cache")], capture_output=True,
                         text=True, timeout=240)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    if _has_gpu():
        assert ran.stdout.rstrip().endswith("0 failures"), ran.stdout
        assert "CHECK one-rank NCCL communicator: ok" in ran.stdout, ran.stdout
    else:
        assert ran.stdout.startswith("NO GPU: "), ran.stdout

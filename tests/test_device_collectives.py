"""The engine's GPU execution of every collective, on real MPI ranks with
host-memory stand-ins for the GPU device and its communicator.

`ops/tests/mpi/device_collectives_test.cc` says what the stand-ins do and
what is checked; this file builds it against the MPI that mpi4py loads (with
every engine source, no TensorFlow) and runs it under mpiexec with 2 and 3
ranks. The real device (CUDA, NCCL) runs in tests/test_gpu.py where there is
a GPU.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hvdkeras.engine import toolchain
from mpi_runner import describe, mpiexec_path, per_rank_output_args, rank_outputs, run_command

REPO = Path(__file__).resolve().parent.parent
OPS = REPO / "ops"
TEST_SOURCE = OPS / "tests" / "mpi" / "device_collectives_test.cc"
FLAGS = ("-std=c++17", "-O1", "-Wall", "-Wextra", "-pthread")
TIMEOUT_S = 120


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> Path:
    gxx = shutil.which(os.environ.get("CXX") or "g++")
    if gxx is None:
        pytest.skip("no C++ compiler; this test builds a C++ binary")
    mpi = toolchain.mpi_library_info()
    assert mpi["include_dir"], mpi
    directory = tmp_path_factory.mktemp("device_collectives")
    sources = [*sorted((OPS / "core").glob("*.cc")), OPS / "tests" / "harness.cc", TEST_SOURCE]
    flags = [*FLAGS, f"-I{OPS}", f"-I{mpi['include_dir']}"]

    def compile_one(source: Path) -> Path:
        obj = directory / f"{source.parent.name}__{source.stem}.o"
        result = subprocess.run([gxx, *flags, "-c", str(source), "-o", str(obj)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"compiling {source}:\n{result.stderr[-4000:]}"
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, sources))
    exe = directory / "device_collectives_test"
    library = Path(mpi["library"])
    result = subprocess.run([gxx, *flags, *map(str, objects), "-o", str(exe),
                             f"-L{library.parent}", f"-l:{library.name}",
                             f"-Wl,-rpath,{library.parent}"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return exe


@pytest.mark.timeout(600)
@pytest.mark.parametrize("np", (1, 2, 3), ids=lambda n: f"np{n}")
def test_device_collectives_on_host_stand_ins(binary: Path, np: int, tmp_path: Path):
    # Each rank's output to its own files (Note [one file per rank] in mpi_runner.py).
    result = run_command([str(mpiexec_path()), "-n", str(np), *per_rank_output_args(tmp_path),
                          str(binary)], timeout=TIMEOUT_S)
    ranks = rank_outputs(tmp_path, np)
    everything = "\n".join(f"--- rank {r} ---\n{out.text}" for r, out in enumerate(ranks))
    assert result.returncode == 0, describe(result) + everything
    for out in ranks:
        assert out.stdout.rstrip().endswith("0 failures"), everything
        assert "[FAIL]" not in out.stdout, everything

"""The engine's GPU execution of every collective, and its GPU paths end to
end, on real MPI ranks with host-memory stand-ins for the GPU device and its
communicator.

`ops/tests/mpi/device_collectives_test.cc` (each collective's steps) and
`ops/tests/mpi/device_engine_test.cc` (the engine with a stand-in backend:
two process sets at once on lanes of their own, failures injected after work
was queued, a set-up failure on one rank, a communicator's own error, a
joined rank's pinned GPU) say what the stand-ins do and what is checked;
this file builds each against the MPI that mpi4py loads (with every engine
source, no TensorFlow) and runs it under mpiexec. The real device (CUDA,
NCCL) runs in tests/test_gpu.py where there is a GPU.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hvdkeras.engine import cuda_build, toolchain
from mpi_runner import describe, mpiexec_path, per_rank_output_args, rank_outputs, run_command

REPO = Path(__file__).resolve().parent.parent
OPS = REPO / "ops"
FLAGS = ("-std=c++17", "-Wall", "-Wextra", "-pthread")
TIMEOUT_S = 360  # the engine stand-in job took 120 s on a loaded 2-core machine


TESTS = {"device_collectives": (1, 2, 3), "device_engine": (2, 3)}


def compile_all(compiler: str, directory: Path, optimize: str = "-O1") -> tuple:
    """Every engine source and the harness compiled with `compiler`:
    (compiler, objects, flags, directory, MPI library)."""
    mpi = toolchain.mpi_library_info()
    assert mpi["include_dir"], mpi
    sources = [*sorted((OPS / "core").glob("*.cc")), OPS / "tests" / "harness.cc",
               *[OPS / "tests" / "mpi" / f"{name}_test.cc" for name in TESTS]]
    flags = [*FLAGS, optimize, f"-I{OPS}", f"-I{mpi['include_dir']}"]

    def compile_one(source: Path) -> Path:
        obj = directory / f"{source.parent.name}__{source.stem}.o"
        result = subprocess.run([compiler, *flags, "-c", str(source), "-o", str(obj)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"compiling {source}:\n{result.stderr[-4000:]}"
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        compiled = list(pool.map(compile_one, sources))
    return compiler, compiled, flags, directory, Path(mpi["library"])


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> tuple:
    """The engine and the harness built with g++ (or $CXX)."""
    gxx = shutil.which(os.environ.get("CXX") or "g++")
    if gxx is None:
        pytest.skip("no C++ compiler; this test builds a C++ binary")
    return compile_all(gxx, tmp_path_factory.mktemp("device_collectives"))


def clang() -> str:
    """clang++'s path; skips the test where it is not installed."""
    found = shutil.which("clang++")
    if found is None:
        pytest.skip("clang++ is not installed (scripts/setup_env.sh installs Debian's clang "
                    "as root); these tests build the engine with it")
    return found


def link(objects: tuple, name: str) -> Path:
    """The test binary of ops/tests/mpi/<name>_test.cc."""
    gxx, compiled, flags, directory, library = objects
    others = {f"mpi__{other}_test.o" for other in TESTS if other != name}
    exe = directory / f"{name}_test"
    if not exe.exists():
        result = subprocess.run([gxx, *flags, *[str(o) for o in compiled if o.name not in others],
                                 "-o", str(exe), f"-L{library.parent}", f"-l:{library.name}",
                                 f"-Wl,-rpath,{library.parent}"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-4000:]
    return exe


CASES = [pytest.param(name, np, id=f"{name}-np{np}") for name, sizes in TESTS.items()
         for np in sizes]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name, np", CASES)
def test_device_paths_on_host_stand_ins(objects: tuple, name: str, np: int, tmp_path: Path):
    run_on_ranks(link(objects, name), np, tmp_path)


def run_on_ranks(binary: Path, np: int, out_dir: Path) -> None:
    """Runs a stand-in test binary on `np` ranks; every rank must pass all of it."""
    # Each rank's output to its own files (Note [one file per rank] in mpi_runner.py).
    result = run_command([str(mpiexec_path()), "-n", str(np), *per_rank_output_args(out_dir),
                          str(binary)], timeout=TIMEOUT_S)
    ranks = rank_outputs(out_dir, np)
    everything = "\n".join(f"--- rank {r} ---\n{out.text}" for r, out in enumerate(ranks))
    assert result.returncode == 0, binary.name + describe(result) + everything
    for out in ranks:
        assert out.stdout.rstrip().endswith("0 failures"), everything
        assert "[FAIL]" not in out.stdout, everything


# The C++ standard leaves the order of a call's arguments open: g++ and
# clang evaluate them in opposite orders, so code that reads in one argument
# what another writes works under one compiler only. The stand-in device
# tests run built with clang too (2 ranks), and the GPU part, which only a
# GPU machine runs, must at least compile under clang without warnings.
@pytest.mark.extended
@pytest.mark.timeout(900)
def test_device_paths_built_with_clang(tmp_path: Path):
    # -O0: the order of evaluation is the compiler's at any level, and the
    # build is quicker.
    built = compile_all(clang(), tmp_path, optimize="-O0")
    for name in TESTS:
        out_dir = tmp_path / f"{name}-out"
        out_dir.mkdir()
        run_on_ranks(link(built, name), 2, out_dir)


@pytest.mark.extended
@pytest.mark.timeout(600)
def test_gpu_part_compiles_with_clang(tmp_path: Path):
    compiler = clang()
    tf_include = None
    try:
        import tensorflow as tf
        tf_include = Path(tf.sysconfig.get_include())
    except ImportError:
        pass
    headers = cuda_build.add_nvrtc_headers(cuda_build.find_headers(tf_include))
    if headers["cuda_version"] is None or headers["nccl_version"] is None:
        pytest.skip(f"no CUDA or NCCL headers to compile the GPU part against: {headers}")
    generated = tmp_path / "generated"
    generated.mkdir()
    (generated / cuda_build.GENERATED_SOURCES_NAME).write_text(cuda_build.kernel_sources_text(OPS))
    includes = [f"-I{d}" for d in headers["include_dirs"]]
    for source in sorted((OPS / "cuda").glob("*.cc")):
        result = subprocess.run([compiler, *FLAGS, "-Werror", "-fsyntax-only", "-DHVDKERAS_CUDA=1",
                                 f"-I{OPS}", f"-I{generated}", *includes, str(source)],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"clang on {source}:\n{result.stderr[-4000:]}"

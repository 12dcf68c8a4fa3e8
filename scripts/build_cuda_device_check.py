"""Builds ops/tests/gpu/cuda_device_check.cc: the CUDA device and NCCL
communicator checked on a real GPU in one process, with no MPI and no
framework (scripts/gpu_check.sh runs it; lent GPU machines may lack
TensorFlow).

    python3 scripts/build_cuda_device_check.py OUTPUT_DIRECTORY

Prints the binary's path. Exits 2 with the reason when the CUDA or NCCL
headers or a C++ compiler are missing. Needs neither TensorFlow nor
hvdkeras's other dependencies: it loads hvdkeras/engine/cuda_build.py on its
own, for the same header search and kernel sources the op library uses.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OPS = REPO / "ops"
# The engine sources the CUDA part needs (everything else is MPI and the
# engine proper, which this check leaves out).
CORE = ("common.cc", "device.cc", "device_packing.cc", "scaling.cc", "reduce_kernels.cc")
FLAGS = ("-std=c++17", "-O2", "-Wall", "-pthread", "-DHVDKERAS_CUDA=1")


def _cuda_build():
    """hvdkeras/engine/cuda_build.py, loaded without importing the package."""
    path = REPO / "hvdkeras" / "engine" / "cuda_build.py"
    spec = importlib.util.spec_from_file_location("hvdkeras_cuda_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tensorflow_include() -> Path | None:
    """TensorFlow's include directory (its CUDA headers match its CUDA), if installed."""
    if importlib.util.find_spec("tensorflow") is None:
        return None
    result = subprocess.run([sys.executable, "-c",
                             "import tensorflow as tf; print(tf.sysconfig.get_include())"],
                            capture_output=True, text=True, timeout=300)
    return Path(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else None


def build(output: Path) -> Path:
    """Compiles and links the check into ``output``; returns the binary's path."""
    gxx = shutil.which(os.environ.get("CXX") or "g++")
    if gxx is None:
        raise SystemExit("cannot build: no C++ compiler (g++)")
    cuda_build = _cuda_build()
    # NVRTC's header may sit in its own wheel rather than beside cuda.h.
    headers = cuda_build.add_nvrtc_headers(cuda_build.find_headers(_tensorflow_include()))
    if headers["cuda_version"] is None or headers["nccl_version"] is None:
        print(f"cannot build: CUDA headers {headers['cuda_version'] or 'not found'} "
              f"(set CUDA_HOME), nccl.h {headers['nccl_version'] or 'not found'}", file=sys.stderr)
        raise SystemExit(2)
    output.mkdir(parents=True, exist_ok=True)
    generated = output / "generated"
    generated.mkdir(exist_ok=True)
    (generated / cuda_build.GENERATED_SOURCES_NAME).write_text(
        cuda_build.kernel_sources_text(OPS))
    flags = [*FLAGS, f"-I{OPS}", f"-I{generated}", *(f"-I{d}" for d in headers["include_dirs"])]
    sources = [*sorted((OPS / "cuda").glob("*.cc")), *(OPS / "core" / name for name in CORE),
               OPS / "tests" / "gpu" / "cuda_device_check.cc"]

    def compile_one(source: Path) -> Path:
        obj = output / f"{source.parent.name}__{source.stem}.o"
        result = subprocess.run([gxx, *flags, "-c", str(source), "-o", str(obj)],
                                capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise SystemExit(f"compiling {source}:\n{result.stderr[-4000:]}")
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, sources))
    binary = output / "cuda_device_check"
    result = subprocess.run([gxx, *flags, *map(str, objects), "-o", str(binary), "-ldl"],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"linking:\n{result.stderr[-4000:]}")
    return binary


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(build(Path(sys.argv[1])))

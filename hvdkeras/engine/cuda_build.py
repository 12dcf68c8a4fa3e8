"""Whether and how the op library's GPU part (``ops/cuda/``) is built.

The GPU part is compiled by the host C++ compiler alone: it calls the CUDA
runtime, the driver, NVRTC and NCCL through ``dlopen`` (so it links none of
them), and its kernels are compiled at run time by NVRTC for the GPU in use.
What it needs at build time is headers of the CUDA version TensorFlow was
built with (TensorFlow's GPU wheel ships them) and ``nccl.h``.

``HVDKERAS_CUDA`` decides: ``1`` builds the GPU part or fails saying what
is missing, ``0`` never builds it, unset builds it when an NVIDIA driver is
present, TensorFlow is a CUDA build and the headers are found (without TensorFlow, when the engine is built
alone, whenever the CUDA and NCCL headers are found). ``decide`` is the pure rule; ``cuda_inputs``
gathers the facts it needs and what the build records (and hashes into the
cache key).

What may import this module: the rest of ``hvdkeras.engine`` and the CLI.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Iterable, Mapping

ENV_VARIABLE = "HVDKERAS_CUDA"
# "1": the automatic choice takes the machine as if it had an NVIDIA driver
# (CI's CUDA leg, on a machine without a GPU); everything else it checks stays.
WITHOUT_DRIVER_VARIABLE = "HVDKERAS_CUDA_WITHOUT_DRIVER"
GENERATED_SOURCES_NAME = "cuda_kernel_sources.inc"
KERNEL_SOURCE = Path("cuda") / "kernels.cu"
# The NVIDIA wheels whose lib/ folders hold what the GPU part loads: CUDA 12's
# one folder per wheel (TensorFlow's), and CUDA 13's shared nvidia/cu13 (what
# current PyTorch and JAX wheels install).
RUNTIME_WHEELS = ("cuda_runtime", "cuda_nvrtc", "nccl", "cu13")
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_RAW_DELIMITER = "hvdkeras_source"
# Where CUDA toolkits live when $CUDA_HOME / $CUDA_PATH do not say.
SYSTEM_CUDA_HOMES = ("/usr/local/cuda",)


class CudaBuildError(RuntimeError):
    """HVDKERAS_CUDA=1, but the GPU part cannot be built here; says what is missing."""


def requested(environ: Mapping[str, str] | None = None) -> bool | None:
    """``HVDKERAS_CUDA`` as True (1), False (0) or None (unset: decide automatically).

    Raises:
        CudaBuildError: for any other value.
    """
    value = (os.environ if environ is None else environ).get(ENV_VARIABLE, "").strip()
    if value == "":
        return None
    if value in ("0", "1"):
        return value == "1"
    raise CudaBuildError(f"{ENV_VARIABLE}={value!r}: use 1 (build the GPU part), 0 (do not) "
                         "or leave it unset (build it when TensorFlow is a CUDA build)")


def driver_present(paths: Iterable[str] = ("/proc/driver/nvidia/version", "/dev/nvidiactl"),
                   library: str = "libcuda.so.1") -> bool:
    """Whether this machine has an NVIDIA driver: its kernel module's files,
    or its user-space library loadable (a container given the driver's
    library without /proc/driver/nvidia)."""
    if any(os.path.exists(p) for p in paths):
        return True
    import ctypes  # lazy: only the automatic CUDA decision loads the library

    try:
        ctypes.CDLL(library)
    except OSError:
        return False
    return True


def decide(wanted: bool | None, tf_cuda_version: str | None, headers: Mapping,
           has_gpu_sources: bool = True, engine_only: bool = False,
           driver: bool = True) -> tuple[bool, str]:
    """Whether to build the GPU part, and why (or why not).

    Args:
        wanted: ``requested()``: True, False or None (automatic).
        tf_cuda_version: the CUDA version TensorFlow was built with ("12.5.1"),
            or None for a CPU-only TensorFlow.
        headers: ``find_headers()``'s result: ``cuda_version`` of the CUDA
            headers found ("12.5", or None) and ``nccl_version`` ("2.27.7" or None).
        has_gpu_sources: whether the op sources hold the GPU part (``cuda/``).
        engine_only: the engine is built without TensorFlow (none is
            installed: Note [the engine alone]); the headers found need match
            no TensorFlow, since the GPU part loads the CUDA runtime it finds.
        driver: ``driver_present()``: with none, the automatic choice skips
            the GPU part (it could never run here); ``HVDKERAS_CUDA=1`` builds it anyway
            (a container image built without a GPU), and
            ``HVDKERAS_CUDA_WITHOUT_DRIVER=1`` keeps the rest of the
            automatic choice (CI's CUDA leg).

    Returns:
        (build it, a sentence saying why).

    Raises:
        CudaBuildError: when ``wanted`` is True and something is missing.

    Example:
    >>> decide(None, None, {})
    (False, 'TensorFlow is a CPU-only build')
    >>> decide(None, None, {"cuda_version": "13.0", "nccl_version": "2.28.9"}, engine_only=True)
    (True, 'the engine alone (no TensorFlow); CUDA headers 13.0, NCCL headers 2.28.9')
    """
    if wanted is False:
        return False, f"{ENV_VARIABLE}=0"
    problem = None
    if wanted is None and not driver:
        return False, (f"no NVIDIA driver on this machine ({ENV_VARIABLE}=1 builds the GPU "
                       "part anyway)")
    if not has_gpu_sources:
        problem = "the op sources have no GPU part (cuda/kernels.cu)"
    elif tf_cuda_version is None and not engine_only:
        problem = "TensorFlow is a CPU-only build"
    elif headers.get("cuda_version") is None:
        problem = "no CUDA headers were found " + (
            "(set CUDA_HOME to a CUDA toolkit)" if engine_only else
            "(TensorFlow's GPU wheel ships them under "
            "tensorflow/include/third_party/gpus/cuda/include)")
    elif not engine_only and headers["cuda_version"].split(".")[0] != tf_cuda_version.split(".")[0]:
        problem = (f"the CUDA headers found are version {headers['cuda_version']}, but "
                   f"TensorFlow was built with CUDA {tf_cuda_version}")
    elif headers.get("nccl_version") is None:
        problem = "nccl.h was not found (pip install nvidia-nccl-cu12)"
    if problem is None:
        found = f"CUDA headers {headers['cuda_version']}, NCCL headers {headers['nccl_version']}"
        if engine_only:
            return True, f"the engine alone (no TensorFlow); {found}"
        return True, f"TensorFlow is built with CUDA {tf_cuda_version}; {found}"
    if wanted:
        raise CudaBuildError(f"{ENV_VARIABLE}=1 but the GPU part cannot be built: {problem}.")
    return False, problem


def _site_dirs() -> list[Path]:
    """The directories Python imports packages from (where the NVIDIA wheels unpack)."""
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def wheel_dirs(part: str, sites: Iterable[Path] | None = None) -> list[Path]:
    """``<site>/nvidia/<wheel>/<part>`` for every installed NVIDIA runtime wheel we use."""
    found = []
    for site in _site_dirs() if sites is None else sites:
        for wheel in RUNTIME_WHEELS:
            directory = Path(site) / "nvidia" / wheel / part
            if directory.is_dir() and directory not in found:
                found.append(directory)
    return found


def _header_version(path: Path, pattern: str, parts: int) -> str | None:
    """A version from ``#define`` lines of a header, or None if the header is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(pattern, text, re.MULTILINE)
    if not match:
        return None
    code = int(match.group(1))
    if parts == 2:  # CUDA_VERSION: major * 1000 + minor * 10
        return f"{code // 1000}.{code % 1000 // 10}"
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"  # NCCL_VERSION_CODE


def find_headers(tf_include: Path | None, sites: Iterable[Path] | None = None) -> dict:
    """The CUDA and NCCL include directories to build with, and their versions.

    CUDA headers come from TensorFlow's wheel (the version it was built with)
    or ``$CUDA_HOME``; ``nccl.h`` from the nvidia-nccl-cu12 wheel, TensorFlow's
    wheel or the system, in that order.
    """
    cuda_candidates = []
    if tf_include is not None:
        bundled = Path(tf_include) / "third_party" / "gpus" / "cuda"
        cuda_candidates.append((bundled / "include", [bundled / "libcudacxx" / "include"]))
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), *SYSTEM_CUDA_HOMES):
        if home:
            cuda_candidates.append((Path(home) / "include", [Path(home) / "include" / "cccl"]))
    result: dict = {"cuda_version": None, "nccl_version": None, "include_dirs": []}
    for include, extras in cuda_candidates:
        version = _header_version(include / "cuda.h", r"^#define CUDA_VERSION (\d+)", 2)
        if version is not None:
            result["cuda_version"] = version
            result["include_dirs"] = [str(include)] + [str(e) for e in extras if e.is_dir()]
            break
    nccl_candidates = [d for d in wheel_dirs("include", sites) if (d / "nccl.h").is_file()]
    if tf_include is not None:
        nccl_candidates.append(Path(tf_include) / "external" / "cuda_nccl" / "include")
    nccl_candidates.append(Path("/usr/include"))
    for include in nccl_candidates:
        version = _header_version(include / "nccl.h", r"^#define NCCL_VERSION_CODE (\d+)", 3)
        if version is not None:
            result["nccl_version"] = version
            # First, so this nccl.h wins over any other on the include path.
            result["include_dirs"].insert(0, str(include))
            break
    return result


def add_nvrtc_headers(headers: dict, sites: Iterable[Path] | None = None) -> dict:
    """Adds the NVRTC wheel's include folder to ``headers`` when ``nvrtc.h`` is
    not beside ``cuda.h`` (a CUDA 13 toolkit without NVRTC, with the wheels of
    PyTorch or JAX). Returns ``headers``."""
    for directory in wheel_dirs("include", sites):
        if (directory / "nvrtc.h").is_file() and not any(
                (Path(d) / "nvrtc.h").is_file() for d in headers["include_dirs"]):
            headers["include_dirs"].append(str(directory))
    return headers


def cuda_inputs(tf_build_info: Mapping, tf_include: Path | None, source_dir: Path,
                environ: Mapping[str, str] | None = None, engine_only: bool = False) -> dict:
    """What the build records about the GPU part (all of it goes into the cache key).
    With ``engine_only`` there is no TensorFlow (``tf_build_info`` is empty)."""
    tf_cuda = tf_build_info.get("cuda_version") if tf_build_info.get("is_cuda_build") else None
    headers = find_headers(tf_include)
    if engine_only:
        headers = add_nvrtc_headers(headers)
    wanted = requested(environ)
    environ = os.environ if environ is None else environ
    driver = (wanted is not None or environ.get(WITHOUT_DRIVER_VARIABLE, "") == "1"
              or driver_present())
    build, reason = decide(wanted, tf_cuda, headers,
                           (Path(source_dir) / KERNEL_SOURCE).is_file(), engine_only,
                           driver=driver)
    return {
        "with_cuda": build,
        "cuda_reason": reason,
        "tf_cuda_version": tf_cuda,
        "cuda_headers": headers["cuda_version"] if build else None,
        "nccl_headers": headers["nccl_version"] if build else None,
        "cuda_include_dirs": headers["include_dirs"] if build else [],
    }


def _included(text: str) -> list[str]:
    return _INCLUDE.findall(text)


def kernel_source_files(source_dir: Path) -> list[str]:
    """kernels.cu's quoted includes, transitively, relative to ``source_dir``, in a stable order."""
    pending = _included((Path(source_dir) / KERNEL_SOURCE).read_text())
    seen: list[str] = []
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.append(name)
        pending += _included((Path(source_dir) / name).read_text())
    return seen


def _raw_string(text: str) -> str:
    if f"){_RAW_DELIMITER}" in text:
        raise CudaBuildError(f"a kernel source contains the delimiter ){_RAW_DELIMITER}")
    return f'R"{_RAW_DELIMITER}({text}){_RAW_DELIMITER}"'


def kernel_sources_text(source_dir: Path) -> str:
    """The C++ that builds kernels.cu and its headers into the library as text.

    NVRTC compiles from these strings at run time, so the installed library
    needs no source files.
    """
    source_dir = Path(source_dir)
    headers = kernel_source_files(source_dir)
    names = ", ".join(f'"{name}"' for name in headers)
    texts = ",\n".join(_raw_string((source_dir / name).read_text()) for name in headers)
    return (
        "// Generated by hvdkeras/engine/cuda_build.py: kernels.cu and the headers it includes.\n"
        f"static const char kKernelSource[] = {_raw_string((source_dir / KERNEL_SOURCE).read_text())};\n"
        f"static const char* const kKernelHeaderNames[] = {{{names}}};\n"
        f"static const char* const kKernelHeaderTexts[] = {{\n{texts}}};\n"
        f"static const int kKernelHeaderCount = {len(headers)};\n"
    )

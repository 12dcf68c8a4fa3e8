"""What the op library is built from: sources, TensorFlow, MPI, compiler.

The binary depends on the installed TensorFlow (headers, ABI flags, framework
library), on the MPI library that mpi4py has loaded into this process, on the
C++ compiler, on the op sources and, for a build with a GPU part, on the CUDA
and NCCL headers (``hvdkeras.engine.cuda_build``). All of those go into ``build_inputs()``;
``cache_key()`` hashes them, so any change of one of them selects a fresh
cache entry ``<cache_root>/ops/<key>/libhvdkeras_ops.so``
(``hvdkeras.engine.build`` compiles into it).

What may import this module: the rest of ``hvdkeras.engine`` and the CLI.
It imports mpi4py only inside the functions that need it, and never TensorFlow
(`hvdkeras.engine.tf_flags` reads its flags).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from hvdkeras.engine import cuda_build, tf_flags

LIBRARY_NAME = "libhvdkeras_ops.so"
# Note [one engine, many bindings]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# The engine (core/, and cuda/ in a GPU build) is its own shared library with
# no framework in it; each framework binding links against it. The TensorFlow
# op library (LIBRARY_NAME) finds it beside itself ($ORIGIN), and other
# backends load it by path, so a process holds one engine whichever binding
# reached it first. Its C entry points (core/c_api.cc) are the one boundary.
# Its file name (and soname) carries the cache key: a process that loaded one
# build's engine (a test of another source tree, say) would otherwise hand
# it to the next build's op library, whose symbols it may lack.
# Note [the engine alone]
# ~~~~~~~~~~~~~~~~~~~~~~~
# Where no TensorFlow is installed (a machine with only PyTorch or JAX, as
# the lent GPU machines are), the engine is built by itself: its sources need
# no TensorFlow header, only the C++ ABI, which without TensorFlow is the
# compiler's default. Its cache key starts with "engine-" and no op library
# is built. Where TensorFlow is installed every backend uses the engine built
# beside the TensorFlow binding, so a process that later loads that binding
# still holds one engine.
CORE_LIBRARY_PREFIX = "libhvdkeras_core-"
# Which libraries a cache entry holds and how they link: part of the cache
# key, so that an entry built the old way is never taken for a new one.
LIBRARY_LAYOUT = 2
BUILD_INFO_NAME = "build_info.json"
SOURCE_SUFFIXES = (".h", ".cc", ".cu", ".def")
CORE_SUBDIR = "core"
TF_SUBDIR = "tf"
COMPILED_SUBDIRS = (CORE_SUBDIR, TF_SUBDIR)
CUDA_SUBDIR = "cuda"  # compiled too when the build has a GPU part
EXCLUDED_SUBDIRS = ("tests",)
# -O3 because GCC vectorizes the engine's elementwise loops (reductions,
# scaling) only from -O3: a float32 sum runs 3.5x faster than at -O2 here.
BASE_CXX_FLAGS = (
    "-std=c++17",
    "-O3",
    "-fPIC",
    "-pthread",
    "-Wno-deprecated-declarations",
    # The engine calls MPI's C interface only. Open MPI's mpi.h would also
    # declare its C++ bindings, whose symbols live in a library (libmpi_cxx)
    # the engine does not link: loading it then fails on an undefined symbol.
    "-DOMPI_SKIP_MPICXX=1",
    "-DMPICH_SKIP_MPICXX=1",
)
SYSTEM_MPI_INCLUDE_DIRS = (
    "/usr/include/x86_64-linux-gnu/mpich",
    "/usr/include/aarch64-linux-gnu/mpich",
    "/usr/include/mpich",
    "/usr/lib/x86_64-linux-gnu/openmpi/include",
    "/usr/lib/aarch64-linux-gnu/openmpi/include",
    "/usr/include/openmpi",
    "/usr/local/include",
    "/usr/include",
)
_LIBMPI_PATTERN = re.compile(r"^libmpi(ch)?\.so")


class BuildError(RuntimeError):
    """The op library could not be built; the message says what to fix."""


# --------------------------------------------------------------------------
# Locating sources, MPI, TensorFlow and the compiler
# --------------------------------------------------------------------------


def ops_source_dir() -> Path:
    """Directory holding the C++ op sources.

    A wheel install ships them as ``hvdkeras/_ops_src``; in a source checkout
    (editable install) they are the repository's top-level ``ops/``.
    """
    package_dir = Path(__file__).resolve().parent.parent
    bundled = package_dir / "_ops_src"
    if bundled.is_dir():
        return bundled
    return package_dir.parent / "ops"


def _loaded_libmpi_path() -> Path:
    """Absolute path of the libmpi shared object mapped into this process."""
    candidates: list[str] = []
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/"):
                candidates.append(fields[5].strip())
    for path in candidates:
        if _LIBMPI_PATTERN.match(os.path.basename(path)):
            return Path(path)
    abi = [p for p in candidates if os.path.basename(p).startswith("libmpi_abi")]
    hint = f" (found only the MPI-ABI library {abi[0]}, which is not supported)" if abi else ""
    raise BuildError(
        "mpi4py is imported but no libmpi.so is mapped into this process" + hint
        + ": install an MPI that mpi4py loads, e.g. `pip install mpich`."
    )


def _wrapper_include_dirs(bin_dir: Path) -> list[Path]:
    """``-I`` directories reported by ``mpicxx -show`` / ``mpicc -show`` in ``bin_dir``."""
    for wrapper in ("mpicxx", "mpicc"):
        executable = bin_dir / wrapper
        if not executable.exists():
            continue
        try:
            shown = subprocess.run(
                [str(executable), "-show"], capture_output=True, text=True, timeout=30
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        return [Path(tok[2:]) for tok in shown.split() if tok.startswith("-I")]
    return []


def _system_include_dirs(vendor: str) -> list[Path]:
    """Common system ``mpi.h`` locations, the ones of ``vendor``'s MPI first."""
    hint = "openmpi" if "open" in vendor.lower() else "mpich"
    ordered = sorted(SYSTEM_MPI_INCLUDE_DIRS, key=lambda d: hint not in d)
    return [Path(d) for d in ordered]


def _find_mpi_include(lib_path: Path, vendor: str = "") -> tuple[Path | None, list[Path]]:
    """Find the directory with the ``mpi.h`` matching ``lib_path``.

    Looks in ``<prefix>/include`` (prefix = parent of the library's directory,
    the layout of the mpich wheel), then where ``mpicxx -show`` points, then in
    common system locations. Returns the directory (or None) and the places tried.
    """
    prefix = lib_path.parent.parent
    searched: list[Path] = []
    groups = (
        lambda: [prefix / "include"],
        lambda: _wrapper_include_dirs(prefix / "bin"),
        lambda: _system_include_dirs(vendor),
    )
    for group in groups:
        for directory in group():
            if directory in searched:
                continue
            searched.append(directory)
            if (directory / "mpi.h").is_file():
                return directory, searched
    return None, searched


def mpi_library_info() -> dict:
    """Describe the MPI that mpi4py loaded: library path, headers, version, vendor.

    ``include_dir`` is None when no ``mpi.h`` was found; ``include_searched``
    then lists where we looked.
    """
    from mpi4py import MPI  # lazy: importing it initializes MPI

    library = _loaded_libmpi_path()
    vendor_name, vendor_version = MPI.get_vendor()
    include_dir, searched = _find_mpi_include(library, vendor_name)
    return {
        "library": str(library),
        "library_dir": str(library.parent),
        "include_dir": str(include_dir) if include_dir else None,
        "include_searched": [str(d) for d in searched],
        "version": " ".join(MPI.Get_library_version().strip().splitlines()[0].split()),
        "vendor": f"{vendor_name} {'.'.join(str(v) for v in vendor_version)}",
    }


def _compiler() -> str | None:
    """Absolute path of ``$CXX`` (or ``g++``), or None when there is none."""
    requested = os.environ.get("CXX") or "g++"
    return shutil.which(requested)


def _compiler_version(compiler: str | None) -> str | None:
    """First line of ``<compiler> --version``."""
    if compiler is None:
        return None
    try:
        result = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0] if lines else None


def _tensorflow_flags() -> tuple[str, list[str], list[str], dict, Path]:
    """TensorFlow version, custom-op compile and link flags, build info, include dir
    (without importing TensorFlow: Note [the engine without TensorFlow in the process])."""
    try:
        record = tf_flags.tensorflow_flags(cache_root() / "toolchain")
    except tf_flags.TensorFlowMissing as exc:
        raise BuildError(str(exc)) from exc
    return (record["version"], record["compile_flags"], record["link_flags"],
            record["build_info"], Path(record["include"]))


def source_files(source_dir: Path) -> list[Path]:
    """Every ``.h``/``.cc``/``.cu`` file under ``source_dir``, except ``tests/``, sorted."""
    files = []
    for path in source_dir.rglob("*"):
        relative = path.relative_to(source_dir)
        if relative.parts[0] in EXCLUDED_SUBDIRS:
            continue
        if path.is_file() and path.suffix in SOURCE_SUFFIXES:
            files.append(path)
    return sorted(files, key=lambda p: p.relative_to(source_dir).as_posix())


def source_hash(source_dir: Path) -> str:
    """SHA-256 over the relative paths and contents of the op sources."""
    digest = hashlib.sha256()
    for path in source_files(source_dir):
        digest.update(path.relative_to(source_dir).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _xla_library(link_flags: list[str]) -> str:
    """TensorFlow's library holding XLA's custom-call registry (see Note [xla
    collectives] in ops/tf/xla_custom_calls.cc), or "" if this TensorFlow has none."""
    directory = next((flag[2:] for flag in link_flags if flag.startswith("-L")), None)
    library = Path(directory or "") / "libtensorflow_cc.so.2"
    return str(library) if directory and library.exists() else ""


def tensorflow_installed() -> bool:
    """Whether a TensorFlow is installed (found without importing it)."""
    return "tensorflow" in sys.modules or tf_flags.installation_fingerprint() is not None


def build_inputs(source_dir: Path | None = None, engine_only: bool = False) -> dict:
    """Everything that determines the compiled binary (imports mpi4py, not TensorFlow).

    With ``engine_only`` (Note [the engine alone]) the inputs name no
    TensorFlow: ``tf_version`` is None and there are no binding flags."""
    source_dir = Path(source_dir) if source_dir else ops_source_dir()
    if not source_dir.is_dir():
        raise BuildError(f"op sources not found at {source_dir}")
    if engine_only:
        tf_version, compile_flags, link_flags, tf_build, tf_include = None, [], [], {}, None
    else:
        tf_version, compile_flags, link_flags, tf_build, tf_include = _tensorflow_flags()
    mpi = mpi_library_info()
    compiler = _compiler()
    return {
        "tf_version": tf_version,
        "tf_compile_flags": compile_flags,
        "tf_link_flags": link_flags,
        "tf_xla_library": _xla_library(link_flags),
        "compiler": compiler,
        "compiler_version": _compiler_version(compiler),
        "cxx_flags": list(BASE_CXX_FLAGS),
        "mpi_library": mpi["library"],
        "mpi_version": mpi["version"],
        "mpi_include": mpi["include_dir"],
        "python": sys.implementation.cache_tag,
        "layout": LIBRARY_LAYOUT,
        "source_hash": source_hash(source_dir),
        **cuda_build.cuda_inputs(tf_build, tf_include, source_dir, engine_only=engine_only),
    }


def engine_only(inputs: dict) -> bool:
    """Whether ``inputs`` build the engine alone (Note [the engine alone])."""
    return "tf_version" in inputs and inputs["tf_version"] is None


def cache_key(inputs: dict) -> str:
    """Short, stable name for a set of build inputs (changes when any input does)."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    if engine_only(inputs):
        return f"engine-{digest}"
    return f"tf{inputs.get('tf_version', 'unknown')}-{digest}"


def cache_root() -> Path:
    """``$HVDKERAS_CACHE_DIR``, or ``~/.cache/hvdkeras``."""
    configured = os.environ.get("HVDKERAS_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "hvdkeras"


def library_path(key: str) -> Path:
    """Where the library for cache key ``key`` lives (whether built or not)."""
    return cache_root() / "ops" / key / LIBRARY_NAME


def core_library_name(key: str) -> str:
    """File name (and soname) of the engine library of cache key ``key``."""
    return f"{CORE_LIBRARY_PREFIX}{key}.so"


def core_library_path(key: str) -> Path:
    """The engine library beside the op library of cache key ``key``."""
    return library_path(key).with_name(core_library_name(key))


def read_build_info(library: Path) -> dict:
    """The ``build_info.json`` written beside ``library``."""
    return json.loads((Path(library).parent / BUILD_INFO_NAME).read_text())



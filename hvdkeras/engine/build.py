"""Compile the hvdkeras op library on the user's machine, once, and cache it.

The cache entry is chosen by ``hvdkeras.engine.toolchain.cache_key`` over
everything the binary depends on. Concurrent callers (e.g. every rank of
``mpiexec -n 4``) serialise on a file lock; exactly one compiles, the others
wait and reuse its result. The finished directory is moved into place with
``os.replace``, so the final path never holds a half-written library.

What may import this module: the rest of ``hvdkeras.engine`` and the CLI.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hvdkeras.engine.cuda_build import GENERATED_SOURCES_NAME, kernel_sources_text
from hvdkeras.engine.file_lock import exclusive_lock
from hvdkeras.engine.toolchain import (BUILD_INFO_NAME, COMPILED_SUBDIRS, CORE_SUBDIR,
                                       core_library_name, core_library_path, CUDA_SUBDIR,
                                       LIBRARY_NAME, TF_SUBDIR, BuildError, build_inputs,
                                       cache_key, engine_only, library_path,
                                       mpi_library_info, ops_source_dir, source_hash,
                                       tensorflow_installed)

_ERROR_TAIL_CHARS = 4000

#: True when the latest ``ensure_built`` call in this process compiled the library.
last_build_performed: bool = False


# --------------------------------------------------------------------------
# Command assembly (pure: no compiler needed)
# --------------------------------------------------------------------------


def compiled_sources(source_dir: Path, with_cuda: bool = False,
                     with_binding: bool = True) -> list[Path]:
    """The ``.cc`` files that make up the library (``core/``, ``tf/`` unless the
    engine is built alone, and ``cuda/`` for a build with a GPU part)."""
    files: list[Path] = []
    subdirs = COMPILED_SUBDIRS if with_binding else (CORE_SUBDIR,)
    for subdir in subdirs + ((CUDA_SUBDIR,) if with_cuda else ()):
        files += (Path(source_dir) / subdir).rglob("*.cc")
    return sorted(files)


def _object_path(source: Path, source_dir: Path, objdir: Path) -> Path:
    """Object file name for ``source``, unique across subdirectories."""
    relative = source.relative_to(source_dir).with_suffix(".o")
    return Path(objdir) / "__".join(relative.parts)


def is_binding_source(source: Path, source_dir: Path) -> bool:
    """True for a TensorFlow binding source (``tf/``); the rest is the engine."""
    return Path(source).relative_to(source_dir).parts[0] == TF_SUBDIR


def compile_commands(inputs: dict, src: Path, objdir: Path,
                     generated: Path | None = None) -> list[list[str]]:
    """One compiler command per library source; each ends with ``-o <object in objdir>``.

    The engine's sources see TensorFlow's ABI and defines but not its headers
    (Note [one engine, many bindings] in toolchain.py); the binding's see both.
    A build with a GPU part also compiles ``cuda/`` with ``HVDKERAS_CUDA=1``,
    the CUDA and NCCL headers, and ``generated`` (the kernel sources as text).
    """
    src = Path(src)
    with_cuda = bool(inputs.get("with_cuda"))
    flags = [*inputs["cxx_flags"], f"-I{src}"]
    if inputs.get("mpi_include"):
        flags.append(f"-I{inputs['mpi_include']}")
    if with_cuda:
        flags += ["-DHVDKERAS_CUDA=1", *(f"-I{d}" for d in inputs["cuda_include_dirs"])]
        if generated is not None:
            flags.append(f"-I{generated}")
    tf_flags = list(inputs["tf_compile_flags"])
    abi_flags = [flag for flag in tf_flags if not flag.startswith("-I")]
    compiler = inputs.get("compiler") or "g++"
    return [
        [compiler, *flags, *(tf_flags if is_binding_source(source, src) else abi_flags),
         "-c", str(source), "-o", str(_object_path(source, src, objdir))]
        for source in compiled_sources(src, with_cuda, with_binding=not engine_only(inputs))
    ]


def tf_library_dir(link_flags: list[str]) -> str | None:
    """Directory of ``libtensorflow_framework.so.2`` (the ``-L`` in TF's link flags)."""
    return next((flag[2:] for flag in link_flags if flag.startswith("-L")), None)


def _mpi_link_flags(inputs: dict) -> list[str]:
    mpi_library = Path(inputs["mpi_library"])
    return [f"-L{mpi_library.parent}", f"-l:{mpi_library.name}",
            f"-Wl,-rpath,{mpi_library.parent}"]


def core_link_command(inputs: dict, objects: list[Path], output: Path) -> list[str]:
    """Linker command for the engine library (no framework): MPI, and ``dl`` for the
    GPU part, which loads CUDA and NCCL with dlopen."""
    command = [inputs.get("compiler") or "g++", "-shared", "-pthread"]
    command += [str(obj) for obj in objects]
    command += ["-o", str(output), f"-Wl,-soname,{core_library_name(cache_key(inputs))}"]
    command += _mpi_link_flags(inputs)
    if inputs.get("with_cuda"):
        command.append("-ldl")
    return command


def link_command(inputs: dict, objects: list[Path], output: Path) -> list[str]:
    """Linker command for the TensorFlow op library ``output``: its objects, TensorFlow,
    and the engine library found beside it at run time."""
    command = [inputs.get("compiler") or "g++", "-shared", "-pthread"]
    command += [str(obj) for obj in objects]
    command += ["-o", str(output)]
    command += [f"-L{Path(output).parent}", f"-l:{core_library_name(cache_key(inputs))}",
                "-Wl,-rpath,$ORIGIN"]
    command += inputs["tf_link_flags"]
    command += _mpi_link_flags(inputs)
    if inputs.get("tf_xla_library"):  # XLA's custom-call registry
        command.append(f"-l:{Path(inputs['tf_xla_library']).name}")
    tf_dir = tf_library_dir(inputs["tf_link_flags"])
    if tf_dir:
        command.append(f"-Wl,-rpath,{tf_dir}")
    return command


# --------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------


def _check_toolchain(inputs: dict, mpi_searched: list[str]) -> None:
    """Raise ``BuildError`` with a fix-it message when a build prerequisite is missing."""
    if not inputs.get("compiler"):
        requested = f" ($CXX is {os.environ['CXX']!r})" if os.environ.get("CXX") else ""
        raise BuildError(
            f"No C++ compiler found (looked for $CXX / g++){requested}: install one, e.g. "
            "`apt-get install g++`, or point $CXX at a C++17 compiler."
        )
    if not shared_cxx_runtime(inputs["compiler"]):
        raise BuildError(
            f"The C++ compiler {inputs['compiler']} has no shared C++ runtime "
            "(`-print-file-name=libstdc++.so` finds none), so it would put its own copy of "
            "libstdc++ inside the engine, beside the one the process already holds, and the "
            "engine would crash on its first message. Point $CXX at a compiler with a shared "
            "libstdc++, such as the system's (`CXX=/usr/bin/g++`)."
        )
    if not inputs.get("mpi_include"):
        raise BuildError(
            f"mpi.h not found for the MPI library {inputs['mpi_library']}; looked in: "
            + ", ".join(mpi_searched)
            + ". Install MPI headers: `pip install mpich` (headers come with it), or for a "
            "system MPI `apt-get install libmpich-dev` / `apt-get install libopenmpi-dev`."
        )
    include_dirs = [f[2:] for f in inputs["tf_compile_flags"] if f.startswith("-I")]
    header = "tensorflow/core/framework/op_kernel.h"
    if not engine_only(inputs) and not any((Path(d) / header).is_file() for d in include_dirs):
        raise BuildError(
            f"TensorFlow C++ headers not found ({header} under {include_dirs or 'no -I dirs'}): "
            "reinstall the tensorflow wheel (`pip install --force-reinstall tensorflow`)."
        )


def shared_cxx_runtime(compiler: str) -> bool:
    """Whether ``compiler`` links the shared libstdc++ (a GCC built without
    it links a static copy into every library it makes). Compilers that do
    not answer the question (clang with libc++) are given the benefit."""
    try:
        result = subprocess.run([compiler, "-print-file-name=libstdc++.so"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return True
    answer = result.stdout.strip()
    return result.returncode != 0 or os.path.isabs(answer)


def run_tool(command: list[str], verbose: bool) -> None:
    """Run one compiler/linker command; raise ``BuildError`` with its output on failure."""
    if verbose:
        print("hvdkeras: " + " ".join(command), file=sys.stderr, flush=True)
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        raise BuildError(f"could not run {command[0]}: {exc}") from exc
    if verbose and result.stderr:
        sys.stderr.write(result.stderr)
    if result.returncode != 0:
        output = (result.stderr or result.stdout)[-_ERROR_TAIL_CHARS:]
        raise BuildError(
            f"command failed with exit code {result.returncode}:\n  {' '.join(command)}\n{output}"
        )


def _compile_all(commands: list[list[str]], verbose: bool) -> None:
    """Run the compile commands in parallel (at most one per CPU)."""
    workers = max(1, min(len(commands), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_tool, command, verbose) for command in commands]
        for future in futures:
            future.result()


def _compile_library(inputs: dict, source_dir: Path, workdir: Path, verbose: bool) -> Path:
    """Compile and link into ``workdir``; return the library path there."""
    objdir = workdir / "obj"
    objdir.mkdir()
    generated = None
    if inputs.get("with_cuda"):
        generated = workdir / "generated"
        generated.mkdir()
        (generated / GENERATED_SOURCES_NAME).write_text(kernel_sources_text(source_dir))
    commands = compile_commands(inputs, source_dir, objdir, generated)
    if not commands:
        raise BuildError(f"no .cc files under {source_dir}/core or {source_dir}/tf")
    _compile_all(commands, verbose)
    engine = [Path(c[-1]) for c in commands if not is_binding_source(Path(c[-3]), source_dir)]
    binding = [Path(c[-1]) for c in commands if is_binding_source(Path(c[-3]), source_dir)]
    engine_library = workdir / core_library_name(cache_key(inputs))
    run_tool(core_link_command(inputs, engine, engine_library), verbose)
    output = engine_library
    if not engine_only(inputs):
        output = workdir / LIBRARY_NAME
        run_tool(link_command(inputs, binding, output), verbose)
    shutil.rmtree(objdir)
    if generated is not None:
        shutil.rmtree(generated)
    return output


def _write_build_info(directory: Path, inputs: dict, key: str, seconds: float) -> None:
    """Record what the library was built from, beside it."""
    info = {
        **inputs,
        "key": key,
        "built_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "build_seconds": round(seconds, 2),
        "device": "CUDA" if inputs.get("with_cuda") else "CPU",
        "cuda": inputs.get("cuda_headers") or False,
        "nccl": inputs.get("nccl_headers") or False,
    }
    (directory / BUILD_INFO_NAME).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")


def _install_directory(staged: Path, final: Path) -> None:
    """Atomically move the finished ``staged`` directory to ``final`` (replacing it)."""
    retired = None
    if final.exists():
        retired = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, retired)
    os.replace(staged, final)
    if retired is not None:
        shutil.rmtree(retired, ignore_errors=True)


def _build_into_cache(inputs: dict, key: str, source_dir: Path, verbose: bool) -> None:
    """Compile in a temporary sibling directory, then move it to the cache entry."""
    final = library_path(key).parent
    gpu_part = " with its GPU part (CUDA)" if inputs.get("with_cuda") else ""
    what = ("the engine alone (no TensorFlow installed)" if engine_only(inputs)
            else f"op library for TF {inputs['tf_version']}")
    print(f"hvdkeras: building {what}{gpu_part} (key {key})", file=sys.stderr, flush=True)
    started = time.monotonic()
    staged = Path(tempfile.mkdtemp(prefix=f".tmp-{key}-", dir=final.parent))
    try:
        _compile_library(inputs, source_dir, staged, verbose)
        # The key names the sources as they were before compiling; a library
        # built while they changed may mix old and new files (and, cached
        # under that key, fail at load with a missing symbol until removed).
        if source_hash(source_dir) != inputs["source_hash"]:
            raise BuildError(
                f"the op sources under {source_dir} changed while the library was being built "
                "(an edit or a checkout during the build), so it could mix old and new code; "
                "nothing was cached. Run again once the sources are settled.")
        seconds = time.monotonic() - started
        _write_build_info(staged, inputs, key, seconds)
        staged.chmod(0o755)  # mkdtemp makes it private; the cache entry is not secret
        _install_directory(staged, final)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    print(f"hvdkeras: {'engine' if engine_only(inputs) else 'op library'} built in "
          f"{seconds:.1f} s", file=sys.stderr, flush=True)


def ensure_built(
    force: bool = False, verbose: bool = False, source_dir: Path | None = None
) -> Path:
    """Return the op library for the current TF/MPI/compiler/sources, building it if needed.

    Safe to call from many processes at once: one builds, the rest wait on the
    lock and reuse its library. Sets ``last_build_performed``.
    """
    source_dir = Path(source_dir) if source_dir else ops_source_dir()
    inputs = build_inputs(source_dir)
    return _ensure(inputs, library_path(cache_key(inputs)), source_dir, force, verbose)


def ensure_engine_built(
    force: bool = False, verbose: bool = False, source_dir: Path | None = None
) -> Path:
    """Return the engine library for the other backends, building it if needed.

    Where TensorFlow is installed, the engine beside its binding (built with
    it); elsewhere the engine alone (Note [the engine alone]).

    Returns:
        The engine library's path.

    Example:
    >>> ensure_engine_built().name.startswith("libhvdkeras_core-")
    True
    """
    if tensorflow_installed():
        library = ensure_built(force, verbose, source_dir)
        return library.with_name(core_library_name(library.parent.name))
    source_dir = Path(source_dir) if source_dir else ops_source_dir()
    inputs = build_inputs(source_dir, engine_only=True)
    return _ensure(inputs, core_library_path(cache_key(inputs)), source_dir, force, verbose)


def _ensure(inputs: dict, library: Path, source_dir: Path, force: bool, verbose: bool) -> Path:
    """``library`` (the cache entry's file for ``inputs``), built under the lock if missing."""
    global last_build_performed
    last_build_performed = False
    key = cache_key(inputs)
    if library.is_file() and not force:
        return library
    _check_toolchain(inputs, mpi_library_info()["include_searched"])
    with exclusive_lock(library.parent.with_name(f"{key}.lock")):
        if library.is_file() and not force:
            return library
        _build_into_cache(inputs, key, source_dir, verbose)
        last_build_performed = True
    return library

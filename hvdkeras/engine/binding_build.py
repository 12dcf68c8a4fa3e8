"""Compiles the bindings of the other backends beside the engine library,
once per cache entry and framework version (Note [one engine, many
bindings] in `toolchain.py`).

A binding is the sources of one `ops/<framework>/` folder, compiled with
the framework's headers and the engine's ABI flags and linked to the
engine library found beside it (`$ORIGIN`). Like the main build it is safe
from many processes at once: one compiles under a file lock, and the
finished file is moved into place.

What may import this module: the backends (through `library`), the CLI.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hvdkeras.engine import build, toolchain
from hvdkeras.engine.file_lock import exclusive_lock


def binding_path(framework: str, version: str) -> Path:
    """Where the `framework` binding of this environment's engine lives."""
    return build.ensure_engine_built().with_name(f"libhvdkeras_{framework}-{version}.so")


def compile_command(framework: str, include_dir: str, output: Path) -> list[str]:
    """The one compiler-and-linker command for `ops/<framework>/*.cc`."""
    engine = build.ensure_engine_built()
    info = toolchain.read_build_info(engine)
    source_dir = toolchain.ops_source_dir()
    sources = sorted(str(p) for p in (source_dir / framework).glob("*.cc"))
    abi_flags = [f for f in info["tf_compile_flags"] if not f.startswith("-I")]
    return [info.get("compiler") or "g++", *info["cxx_flags"], *abi_flags, f"-I{source_dir}",
            f"-I{include_dir}", "-shared", *sources, "-o", str(output),
            f"-L{engine.parent}", f"-l:{engine.name}", "-Wl,-rpath,$ORIGIN"]


def ensure_binding(framework: str, version: str, include_dir: str) -> Path:
    """The compiled binding of `framework` (at `version`, headers in `include_dir`)."""
    final = binding_path(framework, version)
    if final.is_file():
        return final
    with exclusive_lock(final.with_suffix(".lock")):
        if final.is_file():
            return final
        descriptor, staged = tempfile.mkstemp(prefix=f".tmp-{final.name}-", dir=final.parent)
        os.close(descriptor)
        try:
            build.run_tool(compile_command(framework, include_dir, Path(staged)), verbose=False)
            os.chmod(staged, 0o755)
            os.replace(staged, final)
        finally:
            if os.path.exists(staged):
                os.remove(staged)
    return final

"""Tests of the op-library build layer (hvdkeras.engine.toolchain and hvdkeras.engine.build) and the CLI around it.

Most tests need no compiler. The ones marked with ``real_build`` compile a tiny
self-contained op tree (written below into tmp_path, independent of the real
``ops/`` sources) and take tens of seconds each; deselect them with
``-m "not slow"``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from hvdkeras import cli
from hvdkeras.engine import build, toolchain
from mpi_runner import per_rank_output_args, rank_outputs

# The builds here compile one file at a time (the `light` marker: pyproject.toml).
pytestmark = pytest.mark.light

REPO_ROOT = Path(__file__).resolve().parent.parent

TINY_SOURCES = {
    "core/tiny.h": """
        #pragma once
        namespace tiny {
        int mpi_initialized();
        }
    """,
    "core/tiny.cc": """
        #include <mpi.h>
        #include "core/tiny.h"
        namespace tiny {
        int mpi_initialized() {
          int flag = 0;
          MPI_Initialized(&flag);
          return flag;
        }
        }  // namespace tiny
    """,
    "tf/tiny_ops.cc": """
        #include "tensorflow/core/framework/common_shape_fns.h"
        #include "tensorflow/core/framework/op.h"
        #include "tensorflow/core/framework/op_kernel.h"
        #include "core/tiny.h"

        using namespace tensorflow;

        REGISTER_OP("HvdkerasTinyCopy")
            .Input("x: float")
            .Output("y: float")
            .SetShapeFn(shape_inference::UnchangedShape);

        REGISTER_OP("HvdkerasTinyMpiInitialized")
            .Output("flag: int32")
            .SetShapeFn(shape_inference::ScalarShape);

        class TinyCopyOp : public OpKernel {
         public:
          explicit TinyCopyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
          void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(0)); }
        };

        class TinyMpiInitializedOp : public OpKernel {
         public:
          explicit TinyMpiInitializedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
          void Compute(OpKernelContext* ctx) override {
            Tensor* out = nullptr;
            OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
            out->scalar<int32>()() = tiny::mpi_initialized();
          }
        };

        REGISTER_KERNEL_BUILDER(Name("HvdkerasTinyCopy").Device(DEVICE_CPU), TinyCopyOp);
        REGISTER_KERNEL_BUILDER(Name("HvdkerasTinyMpiInitialized").Device(DEVICE_CPU),
                                TinyMpiInitializedOp);
    """,
    "tests/tiny_test.cc": """
        int main() { return 0; }
    """,
}


def _has_compiler() -> bool:
    return shutil.which(os.environ.get("CXX") or "g++") is not None


def real_build(test):
    """Mark a test that really compiles: slow, generous timeout, skipped without g++."""
    test = pytest.mark.timeout(600)(test)
    test = pytest.mark.skipif(not _has_compiler(), reason="no C++ compiler")(test)
    return pytest.mark.slow(test)


def write_tiny_tree(root: Path) -> Path:
    """Write the tiny op source tree under ``root`` and return it."""
    for relative, text in TINY_SOURCES.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return root


def fake_inputs() -> dict:
    """Build inputs as ``build_inputs`` would return them, without importing anything."""
    return {
        "tf_version": "2.21.0",
        "tf_compile_flags": [
            "-I/env/site-packages/tensorflow/include",
            "-D_GLIBCXX_USE_CXX11_ABI=1",
            "--std=c++17",
            "-DEIGEN_MAX_ALIGN_BYTES=64",
        ],
        "tf_link_flags": ["-L/env/site-packages/tensorflow", "-l:libtensorflow_framework.so.2"],
        "compiler": "/usr/bin/g++",
        "compiler_version": "g++ (Debian 12.2.0-14) 12.2.0",
        "cxx_flags": ["-std=c++17", "-O3", "-fPIC", "-pthread"],
        "mpi_library": "/env/lib/libmpi.so.12",
        "mpi_version": "MPICH Version:      5.0.2",
        "mpi_include": "/env/include",
        "python": "cpython-311",
        "source_hash": "0" * 64,
        "with_cuda": False,
        "cuda_reason": "TensorFlow is a CPU-only build",
        "tf_cuda_version": None,
        "cuda_headers": None,
        "nccl_headers": None,
        "cuda_include_dirs": [],
    }


@pytest.fixture
def tiny_tree(tmp_path: Path) -> Path:
    return write_tiny_tree(tmp_path / "src")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("HVDKERAS_CACHE_DIR", str(directory))
    return directory


# --------------------------------------------------------------------------
# cache key and source hash
# --------------------------------------------------------------------------


def test_cache_key_is_stable_and_order_independent():
    inputs = fake_inputs()
    reordered = dict(reversed(list(inputs.items())))
    assert toolchain.cache_key(inputs) == toolchain.cache_key(reordered)
    assert toolchain.cache_key(inputs).startswith("tf2.21.0-")


@pytest.mark.parametrize(
    "field, value",
    [
        ("tf_version", "2.20.0"),
        ("tf_compile_flags", ["-I/env/site-packages/tensorflow/include", "-D_GLIBCXX_USE_CXX11_ABI=0"]),
        ("tf_link_flags", ["-L/other/tensorflow", "-l:libtensorflow_framework.so.2"]),
        ("mpi_library", "/usr/lib/x86_64-linux-gnu/libmpi.so.40"),
        ("mpi_version", "MPICH Version:      4.2.0"),
        ("compiler", "/usr/bin/clang++"),
        ("compiler_version", "g++ 13.1.0"),
        ("cxx_flags", ["-std=c++17", "-O2", "-fPIC", "-pthread"]),
        ("source_hash", "1" * 64),
        ("with_cuda", True),
        ("tf_cuda_version", "12.5.1"),
        ("cuda_headers", "12.5"),
        ("nccl_headers", "2.27.7"),
        ("cuda_include_dirs", ["/env/nvidia/nccl/include"]),
    ],
)
def test_cache_key_changes_with_every_input(field, value):
    changed = {**fake_inputs(), field: value}
    assert toolchain.cache_key(changed) != toolchain.cache_key(fake_inputs())


def test_source_hash_tracks_content_and_names_but_not_tests(tiny_tree: Path):
    original = toolchain.source_hash(tiny_tree)
    assert original == toolchain.source_hash(tiny_tree)

    (tiny_tree / "tests" / "tiny_test.cc").write_text("int main() { return 1; }\n")
    assert toolchain.source_hash(tiny_tree) == original

    core = tiny_tree / "core" / "tiny.cc"
    core.write_text(core.read_text() + "// changed\n")
    edited = toolchain.source_hash(tiny_tree)
    assert edited != original

    core.rename(tiny_tree / "core" / "renamed.cc")
    assert toolchain.source_hash(tiny_tree) not in (original, edited)


def test_source_hash_of_copied_real_sources(tmp_path: Path):
    copy = tmp_path / "ops"
    shutil.copytree(toolchain.ops_source_dir(), copy)
    original = toolchain.source_hash(copy)
    assert original == toolchain.source_hash(toolchain.ops_source_dir())
    (copy / "core" / "extra.h").write_text("#pragma once\n")
    assert toolchain.source_hash(copy) != original


def test_ops_source_dir_finds_the_sources():
    source_dir = toolchain.ops_source_dir()
    assert source_dir.is_dir()
    assert source_dir.name in ("ops", "_ops_src")
    assert (source_dir / "core").is_dir()
    assert any(source_dir.joinpath("core").glob("*.h"))


# --------------------------------------------------------------------------
# command assembly
# --------------------------------------------------------------------------


def test_compile_commands_cover_core_and_tf_but_not_tests(tiny_tree: Path, tmp_path: Path):
    objdir = tmp_path / "obj"
    commands = build.compile_commands(fake_inputs(), tiny_tree, objdir)
    compiled = sorted(Path(c[c.index("-c") + 1]).relative_to(tiny_tree).as_posix() for c in commands)
    assert compiled == ["core/tiny.cc", "tf/tiny_ops.cc"]
    for command in commands:
        assert command[0] == "/usr/bin/g++"
        assert "-D_GLIBCXX_USE_CXX11_ABI=1" in command
        # Note [one engine, many bindings]: only the binding sees TensorFlow's headers.
        binding = "/tf/" in command[command.index("-c") + 1]
        assert ("-I/env/site-packages/tensorflow/include" in command) == binding
        assert "-I/env/include" in command
        assert f"-I{tiny_tree}" in command
        assert "-fPIC" in command and "-std=c++17" in command
        assert Path(command[command.index("-o") + 1]).parent == objdir
    objects = [c[c.index("-o") + 1] for c in commands]
    assert len(set(objects)) == len(objects)


def test_link_command_links_mpi_and_tensorflow(tmp_path: Path):
    output = tmp_path / toolchain.LIBRARY_NAME
    command = build.link_command(fake_inputs(), [tmp_path / "a.o"], output)
    assert "-shared" in command
    assert command[command.index("-o") + 1] == str(output)
    assert "-l:libtensorflow_framework.so.2" in command
    assert "-L/env/lib" in command and "-l:libmpi.so.12" in command
    assert "-Wl,-rpath,/env/lib" in command
    assert "-Wl,-rpath,/env/site-packages/tensorflow" in command
    # The engine library, found beside the op library wherever the cache moves it.
    engine = toolchain.core_library_name(toolchain.cache_key(fake_inputs()))
    assert f"-l:{engine}" in command and "-Wl,-rpath,$ORIGIN" in command


def test_engine_library_links_mpi_without_tensorflow(tmp_path: Path):
    engine = toolchain.core_library_name(toolchain.cache_key(fake_inputs()))
    output = tmp_path / engine
    command = build.core_link_command(fake_inputs(), [tmp_path / "a.o"], output)
    assert command[command.index("-o") + 1] == str(output)
    assert f"-Wl,-soname,{engine}" in command
    assert "-l:libmpi.so.12" in command
    assert not any("tensorflow" in part for part in command)


def engine_alone_inputs() -> dict:
    """Note [the engine alone]: what ``build_inputs(engine_only=True)`` gives."""
    return {**fake_inputs(), "tf_version": None, "tf_compile_flags": [], "tf_link_flags": [],
            "tf_xla_library": ""}


def test_the_engine_alone_compiles_no_binding_and_has_its_own_key(tiny_tree: Path,
                                                                   tmp_path: Path):
    inputs = engine_alone_inputs()
    assert build.engine_only(inputs) and not build.engine_only(fake_inputs())
    commands = build.compile_commands(inputs, tiny_tree, tmp_path / "obj")
    compiled = [Path(c[c.index("-c") + 1]).relative_to(tiny_tree).as_posix() for c in commands]
    assert compiled == ["core/tiny.cc"]
    assert not any("tensorflow" in part for part in commands[0])
    key = toolchain.cache_key(inputs)
    assert key.startswith("engine-") and key != toolchain.cache_key(fake_inputs())


def test_the_engine_alone_is_built_and_loaded_where_no_tensorflow_is(tiny_tree: Path,
                                                                     cache_dir: Path,
                                                                     monkeypatch):
    """Without TensorFlow, `ensure_engine_built` builds the engine under an
    "engine-" key (the tiny tree: one core source) and makes no op library."""
    monkeypatch.setattr(build, "tensorflow_installed", lambda: False)
    monkeypatch.setattr(build, "build_inputs",
                        lambda source_dir, engine_only: {**engine_alone_inputs(),
                                                         "source_hash": toolchain.source_hash(
                                                             source_dir)})
    monkeypatch.setattr(build, "_compile_library",
                        lambda inputs, source_dir, workdir, verbose: (
                            workdir / toolchain.core_library_name(toolchain.cache_key(inputs))
                        ).write_text("engine"))
    path = build.ensure_engine_built(source_dir=tiny_tree)
    assert path.name.startswith("libhvdkeras_core-engine-") and path.read_text() == "engine"
    assert not (path.parent / toolchain.LIBRARY_NAME).exists()
    assert toolchain.read_build_info(path)["tf_version"] is None


def test_a_compiler_without_a_shared_cxx_runtime_is_refused(tmp_path: Path, monkeypatch):
    """A GCC without libstdc++.so links a second C++ runtime into the engine
    (which then crashed on its first message on a lent GPU machine). The
    compiler here is a stand-in script answering as such a GCC does."""
    fake = tmp_path / "g++"
    fake.write_text('#!/bin/sh\necho "libstdc++.so"\n')
    fake.chmod(0o755)
    assert not build.shared_cxx_runtime(str(fake))
    assert build.shared_cxx_runtime(shutil.which("g++") or "/usr/bin/g++")
    inputs = {**fake_inputs(), "compiler": str(fake)}
    with pytest.raises(toolchain.BuildError, match=r"no shared C\+\+ runtime.*CXX=/usr/bin/g\+\+"):
        build._check_toolchain(inputs, [])


def test_real_build_inputs_describe_this_environment():
    inputs = toolchain.build_inputs()
    assert "-D_GLIBCXX_USE_CXX11_ABI=1" in inputs["tf_compile_flags"]
    assert Path(inputs["mpi_library"]).is_file()
    assert Path(inputs["mpi_library"]).name.startswith("libmpi")
    assert (Path(inputs["mpi_include"]) / "mpi.h").is_file()
    # Whether the GPU part is built is tests/test_cuda_build.py's subject; here:
    # a GPU part names the headers it uses, and they exist.
    if inputs["with_cuda"]:
        assert inputs["cuda_headers"] and inputs["nccl_headers"]
        assert all(Path(d).is_dir() for d in inputs["cuda_include_dirs"])
    assert inputs["cxx_flags"] == list(toolchain.BASE_CXX_FLAGS)
    assert inputs["source_hash"] == toolchain.source_hash(toolchain.ops_source_dir())
    info = toolchain.mpi_library_info()
    assert info["vendor"] and info["version"]


def test_system_mpi_headers_of_the_loaded_vendor_come_first():
    open_mpi_dirs = [str(d) for d in toolchain._system_include_dirs("Open MPI")]
    mpich_dirs = [str(d) for d in toolchain._system_include_dirs("MPICH")]
    assert "openmpi" in open_mpi_dirs[0] and "mpich" in mpich_dirs[0]
    assert sorted(open_mpi_dirs) == sorted(mpich_dirs) == sorted(toolchain.SYSTEM_MPI_INCLUDE_DIRS)


def test_cache_root_honours_environment(cache_dir: Path):
    assert toolchain.cache_root() == cache_dir
    key = toolchain.cache_key(fake_inputs())
    assert toolchain.library_path(key) == cache_dir / "ops" / key / "libhvdkeras_ops.so"


# --------------------------------------------------------------------------
# errors and CLI
# --------------------------------------------------------------------------


def test_missing_compiler_is_a_clear_error(tiny_tree: Path, cache_dir: Path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-hvdkeras")
    with pytest.raises(toolchain.BuildError, match="No C\\+\\+ compiler found"):
        build.ensure_built(source_dir=tiny_tree)
    assert not (cache_dir / "ops").exists() or not any((cache_dir / "ops").glob("*/*.so"))


def test_cli_build_error_exits_2(cache_dir: Path, monkeypatch, capsys):
    monkeypatch.setenv("CXX", "no-such-compiler-hvdkeras")
    assert cli.main(["build"]) == 2
    assert "No C++ compiler found" in capsys.readouterr().err


def test_cli_has_build_and_check():
    parser = cli.build_parser()
    assert parser.parse_args(["build", "--force", "--verbose"]).force is True
    assert parser.parse_args(["check"]).handler is cli.COMMANDS["check"].handler
    assert cli.thread_level_name(3) == "MPI_THREAD_MULTIPLE"


def test_compiler_error_is_reported_and_leaves_no_library(tmp_path: Path, cache_dir: Path):
    broken = tmp_path / "broken"
    (broken / "core").mkdir(parents=True)
    (broken / "core" / "bad.cc").write_text("this is not C++;\n")
    with pytest.raises(toolchain.BuildError) as caught:
        build.ensure_built(source_dir=broken)
    message = str(caught.value)
    assert "bad.cc" in message and "error" in message
    ops_dir = cache_dir / "ops"
    assert not list(ops_dir.glob("*/*.so"))
    assert not list(ops_dir.glob(".tmp-*"))
    assert not build.last_build_performed


def test_missing_mpi_header_is_a_clear_error(tiny_tree: Path, cache_dir: Path, monkeypatch):
    monkeypatch.setattr(toolchain, "_find_mpi_include", lambda *args: (None, [Path("/nowhere/include")]))
    with pytest.raises(toolchain.BuildError, match="mpi.h not found") as caught:
        build.ensure_built(source_dir=tiny_tree)
    assert "/nowhere/include" in str(caught.value) and "pip install mpich" in str(caught.value)


# --------------------------------------------------------------------------
# packaging
# --------------------------------------------------------------------------


def _load_module_from(path: Path, name: str):
    """Import the file ``path`` as a fresh module called ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wheel_carries_op_sources(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in"):
        shutil.copy2(REPO_ROOT / name, project / name)
    for name in ("hvdkeras", "ops"):
        shutil.copytree(REPO_ROOT / name, project / name,
                        ignore=shutil.ignore_patterns("__pycache__", "_ops_src"))
    wheels = tmp_path / "wheels"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(project), "-w", str(wheels)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    (wheel,) = wheels.glob("hvdkeras-0.1.0-*.whl")
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(unpacked)
    for source in toolchain.source_files(REPO_ROOT / "ops"):
        relative = source.relative_to(REPO_ROOT / "ops").as_posix()
        assert f"hvdkeras/_ops_src/{relative}" in names
    installed = _load_module_from(unpacked / "hvdkeras" / "engine" / "toolchain.py",
                                  "hvdkeras_wheel_toolchain")
    assert installed.ops_source_dir() == unpacked / "hvdkeras" / "_ops_src"
    assert toolchain.source_hash(installed.ops_source_dir()) == toolchain.source_hash(REPO_ROOT / "ops")


# --------------------------------------------------------------------------
# real builds
# --------------------------------------------------------------------------


@real_build
def test_sources_changed_during_the_build_cache_nothing(tiny_tree: Path, cache_dir: Path,
                                                         monkeypatch):
    compile_for_real = build._compile_library

    def compile_then_edit(inputs, source_dir, workdir, verbose):
        library = compile_for_real(inputs, source_dir, workdir, verbose)
        source = Path(source_dir) / "core" / "tiny.cc"
        source.write_text(source.read_text() + "// edited during the build\n")
        return library

    monkeypatch.setattr(build, "_compile_library", compile_then_edit)
    with pytest.raises(toolchain.BuildError, match="changed while the library was being built"):
        build.ensure_built(source_dir=tiny_tree)
    ops_dir = cache_dir / "ops"
    assert not list(ops_dir.glob("*/*.so")) and not list(ops_dir.glob(".tmp-*"))


@pytest.mark.slow  # compiles a small library twice
def test_build_reuses_cache_and_rebuilds_on_source_change(tiny_tree: Path, cache_dir: Path):
    import tensorflow as tf

    library = build.ensure_built(source_dir=tiny_tree)
    assert build.last_build_performed
    assert library.is_file() and library.parent.parent == cache_dir / "ops"
    info = toolchain.read_build_info(library)
    assert info["device"] == "CPU" and info["cuda"] is False and info["nccl"] is False
    assert info["source_hash"] == toolchain.source_hash(tiny_tree)

    module = tf.load_op_library(str(library))
    assert module.hvdkeras_tiny_copy(tf.constant([1.0, 2.0])).numpy().tolist() == [1.0, 2.0]
    # 1 only if the library resolved MPI_Initialized in the libmpi mpi4py initialised.
    assert int(module.hvdkeras_tiny_mpi_initialized()) == 1

    assert build.ensure_built(source_dir=tiny_tree) == library
    assert not build.last_build_performed

    source = tiny_tree / "core" / "tiny.cc"
    source.write_text(source.read_text() + "// touched\n")
    rebuilt = build.ensure_built(source_dir=tiny_tree)
    assert build.last_build_performed
    assert rebuilt != library and rebuilt.is_file()
    assert not list((cache_dir / "ops").glob(".tmp-*")), "temporary build dirs left behind"


# Each rank writes its own result file and mpiexec writes each rank's output
# to a file of its own (see Note [one file per rank] in mpi_runner.py).
RANK_SCRIPT = """
import json, pathlib, sys
from mpi4py import MPI
from hvdkeras.engine import build
path = build.ensure_built(source_dir=sys.argv[1])
rank = MPI.COMM_WORLD.Get_rank()
pathlib.Path(sys.argv[2], f"result_{rank}.json").write_text(json.dumps(
    {"rank": rank, "built": build.last_build_performed, "path": str(path)}))
"""


@real_build
def test_two_ranks_importing_at_once_build_once(tiny_tree: Path, cache_dir: Path, tmp_path: Path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "HVDKERAS_CACHE_DIR": str(cache_dir)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    out_dir = tmp_path / "results"
    out_dir.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    result = subprocess.run(
        [str(mpiexec), "-n", "2", *per_rank_output_args(logs), sys.executable, str(script),
         str(tiny_tree), str(out_dir)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    ranks = rank_outputs(logs, 2)
    assert result.returncode == 0, "".join(r.text for r in ranks)[-4000:]
    results = [json.loads(p.read_text()) for p in sorted(out_dir.glob("result_*.json"))]
    assert sorted(r["rank"] for r in results) == [0, 1]
    assert sum(r["built"] for r in results) == 1
    assert len({r["path"] for r in results}) == 1
    assert sum(r.stderr.count("hvdkeras: building op library") for r in ranks) == 1


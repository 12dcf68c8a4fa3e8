"""The op library's GPU part: when it is built, from what, and that what CI
builds here (no GPU) compiles, links, loads and works as a CPU build.

The rule (`cuda_build.decide`) and the header search are pure and tested
with made-up inputs and header files. The real builds use this machine's
TensorFlow, its CUDA headers and NVRTC; only running kernels needs a GPU
(tests/gpu/).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdkeras.engine import build, c_api, cuda_build, library, toolchain

REPO = Path(__file__).resolve().parent.parent
GOOD_HEADERS = {"cuda_version": "12.5", "nccl_version": "2.27.7", "include_dirs": []}


# --------------------------------------------------------------------------
# the rule
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [("", None), ("1", True), ("0", False),
                                             (" 1 ", True)])
def test_requested_reads_the_variable(value, expected):
    assert cuda_build.requested({"HVDKERAS_CUDA": value}) is expected
    assert cuda_build.requested({}) is None


def test_requested_rejects_other_values():
    with pytest.raises(cuda_build.CudaBuildError, match=r"HVDKERAS_CUDA='yes': use 1"):
        cuda_build.requested({"HVDKERAS_CUDA": "yes"})


def test_automatic_build_needs_a_cuda_tensorflow_and_headers():
    assert cuda_build.decide(None, "12.5.1", GOOD_HEADERS)[0] is True
    assert cuda_build.decide(None, None, GOOD_HEADERS) == (False, "TensorFlow is a CPU-only build")
    built, why = cuda_build.decide(None, "12.5.1", {"cuda_version": None})
    assert not built and "no CUDA headers" in why
    built, why = cuda_build.decide(None, "12.5.1", {**GOOD_HEADERS, "cuda_version": "13.0"})
    assert not built and why == ("the CUDA headers found are version 13.0, but TensorFlow was "
                                 "built with CUDA 12.5.1")
    built, why = cuda_build.decide(None, "12.5.1", {**GOOD_HEADERS, "nccl_version": None})
    assert not built and "nvidia-nccl-cu12" in why


def test_no_driver_skips_the_gpu_part_unless_it_is_forced():
    built, why = cuda_build.decide(None, "12.5.1", GOOD_HEADERS, driver=False)
    assert not built and why.startswith("no NVIDIA driver") and "HVDKERAS_CUDA=1" in why
    assert cuda_build.decide(True, "12.5.1", GOOD_HEADERS, driver=False)[0] is True
    assert cuda_build.decide(None, None, GOOD_HEADERS, engine_only=True, driver=False)[0] is False


def test_without_driver_variable_keeps_the_automatic_choice(tmp_path):
    environ = {"HVDKERAS_CUDA_WITHOUT_DRIVER": "1"}
    sources = tmp_path / "ops"
    (sources / "cuda").mkdir(parents=True)
    (sources / "cuda" / "kernels.cu").write_text("")
    inputs = cuda_build.cuda_inputs({"is_cuda_build": False}, None, sources, environ)
    assert inputs["with_cuda"] is False and inputs["cuda_reason"] == "TensorFlow is a CPU-only build"


def test_driver_present_looks_at_the_module_files_and_the_library(tmp_path):
    marker = tmp_path / "version"
    marker.write_text("NVRM")
    assert cuda_build.driver_present([str(marker)], library="libhvdkeras-none.so")
    assert not cuda_build.driver_present([str(tmp_path / "absent")],
                                         library="libhvdkeras-none.so")


def test_sources_without_a_gpu_part_build_none():
    assert cuda_build.decide(None, "12.5.1", GOOD_HEADERS, has_gpu_sources=False) == (
        False, "the op sources have no GPU part (cuda/kernels.cu)")


def test_forcing_off_wins_and_forcing_on_fails_loudly():
    assert cuda_build.decide(False, "12.5.1", GOOD_HEADERS) == (False, "HVDKERAS_CUDA=0")
    assert cuda_build.decide(True, "12.5.1", GOOD_HEADERS)[0] is True
    with pytest.raises(cuda_build.CudaBuildError,
                       match=r"HVDKERAS_CUDA=1 but the GPU part cannot be built: TensorFlow is "
                             r"a CPU-only build\."):
        cuda_build.decide(True, None, GOOD_HEADERS)


def test_the_engine_alone_needs_only_headers():
    """Note [the engine alone]: without TensorFlow there is no CUDA version to
    match, so any CUDA major with NCCL headers builds the GPU part."""
    for version in ("12.5", "13.0"):
        built, why = cuda_build.decide(None, None, {**GOOD_HEADERS, "cuda_version": version},
                                       engine_only=True)
        assert built and why.startswith("the engine alone (no TensorFlow)"), why
    built, why = cuda_build.decide(None, None, {"cuda_version": None}, engine_only=True)
    assert not built and "CUDA_HOME" in why
    built, why = cuda_build.decide(None, None, {**GOOD_HEADERS, "nccl_version": None},
                                   engine_only=True)
    assert not built and "nccl.h" in why
    with pytest.raises(cuda_build.CudaBuildError, match="no CUDA headers"):
        cuda_build.decide(True, None, {"cuda_version": None}, engine_only=True)
    assert cuda_build.decide(False, None, GOOD_HEADERS, engine_only=True) == (
        False, "HVDKERAS_CUDA=0")


def test_nvrtc_headers_are_added_from_their_wheel_when_missing(tmp_path: Path):
    wheel = tmp_path / "site" / "nvidia" / "cuda_nvrtc" / "include"
    _header(wheel / "nvrtc.h", "")
    headers = {"include_dirs": [str(tmp_path / "cuda" / "include")]}
    cuda_build.add_nvrtc_headers(headers, [tmp_path / "site"])
    assert headers["include_dirs"][-1] == str(wheel)
    _header(tmp_path / "beside" / "nvrtc.h", "")
    beside = {"include_dirs": [str(tmp_path / "beside")]}
    assert cuda_build.add_nvrtc_headers(beside, [tmp_path / "site"])["include_dirs"] == [
        str(tmp_path / "beside")]


def _header(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_headers_come_from_tensorflow_and_the_nccl_wheel_first(tmp_path: Path, monkeypatch):
    # Made-up header files: only their version lines are read.
    tf_include = tmp_path / "tensorflow" / "include"
    cuda = tf_include / "third_party" / "gpus" / "cuda"
    _header(cuda / "include" / "cuda.h", "#define CUDA_VERSION 12050\n")
    (cuda / "libcudacxx" / "include").mkdir(parents=True)
    _header(tf_include / "external" / "cuda_nccl" / "include" / "nccl.h",
            "#define NCCL_VERSION_CODE 22707\n")
    site = tmp_path / "site"
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    found = cuda_build.find_headers(tf_include, sites=[site])
    assert found["cuda_version"] == "12.5" and found["nccl_version"] == "2.27.7"
    assert found["include_dirs"] == [str(tf_include / "external" / "cuda_nccl" / "include"),
                                     str(cuda / "include"), str(cuda / "libcudacxx" / "include")]
    # The NCCL wheel's header wins over TensorFlow's copy.
    _header(site / "nvidia" / "nccl" / "include" / "nccl.h", "#define NCCL_VERSION_CODE 23203\n")
    found = cuda_build.find_headers(tf_include, sites=[site])
    assert found["nccl_version"] == "2.32.3"
    assert found["include_dirs"][0] == str(site / "nvidia" / "nccl" / "include")


def test_no_headers_anywhere(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "nothing"))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cuda_build, "SYSTEM_CUDA_HOMES", ())
    found = cuda_build.find_headers(tmp_path / "no-tf", sites=[])
    assert found["cuda_version"] is None


def test_a_toolkit_of_another_cuda_major_is_found_but_not_used(tmp_path: Path, monkeypatch):
    # This machine's /usr/local/cuda is CUDA 13; TensorFlow's wheels are CUDA 12.
    home = tmp_path / "cuda13"
    _header(home / "include" / "cuda.h", "#define CUDA_VERSION 13000\n")
    monkeypatch.setenv("CUDA_HOME", str(home))
    found = cuda_build.find_headers(tmp_path / "no-tf", sites=[])
    assert found["cuda_version"] == "13.0"
    built, why = cuda_build.decide(None, "12.5.1", {**found, "nccl_version": "2.27.7"})
    assert not built and "version 13.0" in why


def test_kernel_sources_are_kernels_cu_and_the_headers_it_includes():
    ops = toolchain.ops_source_dir()
    assert set(cuda_build.kernel_source_files(ops)) == {
        "core/copy_batch.h", "core/element_ops.h", "core/half.h", "core/portable.h"}
    text = cuda_build.kernel_sources_text(ops)
    assert "hvdkeras_copy_bytes" in text and "kKernelHeaderCount = 4;" in text


def test_compile_commands_of_a_gpu_build(tmp_path: Path):
    inputs = {"cxx_flags": ["-O3"], "tf_compile_flags": ["-I/tf"], "compiler": "g++",
              "mpi_include": "/mpi", "with_cuda": True,
              "cuda_include_dirs": ["/nccl/include", "/cuda/include"]}
    ops = toolchain.ops_source_dir()
    commands = build.compile_commands(inputs, ops, tmp_path, tmp_path / "generated")
    compiled = {Path(c[c.index("-c") + 1]).relative_to(ops).parts[0] for c in commands}
    assert compiled == {"core", "tf", "cuda"}
    for command in commands:
        assert "-DHVDKERAS_CUDA=1" in command and f"-I{tmp_path / 'generated'}" in command
        binding = Path(command[command.index("-c") + 1]).relative_to(ops).parts[0] == "tf"
        if binding:  # the CUDA headers win over TensorFlow's copies
            assert command.index("-I/nccl/include") < command.index("-I/tf")
        else:  # the engine never sees TensorFlow's headers
            assert "-I/tf" not in command
    cpu = build.compile_commands({**inputs, "with_cuda": False}, ops, tmp_path)
    assert {Path(c[c.index("-c") + 1]).relative_to(ops).parts[0] for c in cpu} == {"core", "tf"}
    assert not any("-DHVDKERAS_CUDA=1" in c for c in cpu)


# --------------------------------------------------------------------------
# the real library of this environment
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built():
    """(build info, ctypes handle) of the library the suite uses."""
    lib = library.handle()
    return toolchain.read_build_info(library.library_path()), lib


def test_ci_builds_the_gpu_part_where_it_must(built):
    """scripts/test.sh sets HVDKERAS_REQUIRE_CUDA_BUILD=1: there a silent CPU
    build (headers not found, say) fails the leg instead of passing it."""
    info, lib = built
    if os.environ.get("HVDKERAS_REQUIRE_CUDA_BUILD") != "1":
        pytest.skip("HVDKERAS_REQUIRE_CUDA_BUILD is not set (only CI's CUDA leg requires it)")
    assert info["with_cuda"], info["cuda_reason"]
    assert c_api.build_flavor(lib) == "cuda"


def test_gpu_part_registers_the_xla_targets_for_gpus(built):
    """A GPU build with XLA's headers registers the CUDA custom-call targets
    (Note [xla collectives]); a CPU build registers none for GPUs."""
    info, lib = built
    expected = int(bool(info["with_cuda"]) and lib.hvdkeras_xla_calls_built() == 1)
    assert lib.hvdkeras_xla_gpu_calls_built() == expected


def test_gpu_part_reports_what_it_was_built_with(built):
    info, lib = built
    if not info["with_cuda"]:
        assert c_api.build_flavor(lib) == "cpu" and c_api.gpu_build_info(lib) == {}
        assert c_api.gpu_probe(lib) == (-1, "this op library was built without GPU support")
        return
    assert info["device"] == "CUDA" and info["cuda"] == info["cuda_headers"]
    runtime = c_api.gpu_build_info(lib)
    assert runtime["cuda_headers"] == info["cuda_headers"]
    # The NCCL library really loads here and reports its version.
    assert re.match(r"^\d+\.\d+\.\d+ \(built with " + re.escape(info["nccl_headers"]) + r"\)$",
                    runtime["nccl"]), runtime
    count, description = c_api.gpu_probe(lib)
    if count < 0:
        assert "driver" in description or "GPU" in description


@pytest.mark.parametrize("arch", ["sm_70", "sm_80", "sm_90"])
def test_nvrtc_compiles_the_kernels_without_a_gpu(built, arch):
    info, lib = built
    if not info["with_cuda"]:
        pytest.skip(f"this library has no GPU part ({info['cuda_reason']})")
    assert c_api.gpu_compile_kernels(lib, arch) > 10_000


def test_compiled_kernels_are_kept_and_reused(built, tmp_path: Path):
    """NVRTC runs once per machine: the result is kept in the kernel cache,
    keyed by architecture, NVRTC version and source, and read back."""
    info, lib = built
    if not info["with_cuda"]:
        pytest.skip(f"this library has no GPU part ({info['cuda_reason']})")
    lib.hvdkeras_gpu_set_kernel_cache_dir(str(tmp_path).encode())
    try:
        size = c_api.gpu_compile_kernels(lib, "sm_80")
        (kept,) = list(tmp_path.iterdir())
        assert re.fullmatch(r"kernels-sm_80-nvrtc\d+\.\d+-[0-9a-f]{16}\.cubin", kept.name), kept
        assert kept.stat().st_size == size
        # The next compile for sm_80 reads the cache (a stand-in entry here).
        kept.write_bytes(b"k" * 12345)
        assert c_api.gpu_compile_kernels(lib, "sm_80") == 12345
        assert len(list(tmp_path.iterdir())) == 1  # no temporary file left
    finally:
        lib.hvdkeras_gpu_set_kernel_cache_dir(str(toolchain.cache_root() / "kernels").encode())


def test_nvrtc_errors_are_reported(built):
    info, lib = built
    if not info["with_cuda"]:
        pytest.skip(f"this library has no GPU part ({info['cuda_reason']})")
    with pytest.raises(RuntimeError, match="invalid value for --gpu-architecture"):
        c_api.gpu_compile_kernels(lib, "sm_1")


_FORCED_BUILD = """
import ctypes, json, sys
from hvdkeras.engine import build, c_api, toolchain
path = build.ensure_built()
info = toolchain.read_build_info(path)
lib = c_api.bind(ctypes.CDLL(str(path)))
print(json.dumps({"with_cuda": info["with_cuda"], "device": info["device"],
                  "flavor": c_api.build_flavor(lib), "key": info["key"]}))
"""


@pytest.mark.slow
@pytest.mark.extended  # the TensorFlow versions leg builds CPU-only libraries too
def test_forcing_the_gpu_part_off_builds_a_cpu_library(built, tmp_path: Path):
    env = {**os.environ, "HVDKERAS_CUDA": "0", "HVDKERAS_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", _FORCED_BUILD], capture_output=True,
                            text=True, timeout=900, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out == {**out, "with_cuda": False, "device": "CPU", "flavor": "cpu"}
    default, _ = built
    if default["with_cuda"]:
        assert out["key"] != default["key"]  # the GPU part is part of the cache key

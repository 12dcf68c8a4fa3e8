"""What the torch and JAX bindings do with tensors outside host memory,
checked without a GPU: which collectives take CUDA tensors under torch, and
the clear error JAX gives for an array on a platform it has no FFI handler
for (it has one for the CPU and one for CUDA). The GPU paths themselves run where there is a GPU
(scripts/gpu_check.sh, tests/scripts/gpu_backend_fit_job.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")

from hvdkeras.backends.jax import ops as jax_ops  # noqa: E402
from hvdkeras.backends.torch import ops as torch_ops  # noqa: E402


class StandInTpuArray:
    """Stand-in (pure logic only): an array that says it lives on a TPU."""

    class Device:
        platform = "tpu"

    def devices(self):
        return {self.Device()}


class StandInGpuArray:
    """Stand-in (pure logic only): an array on a GPU whose client reports
    `version` (JAX names CUDA and ROCm GPUs both "gpu")."""

    def __init__(self, version: str):
        client = type("Client", (), {"platform_version": version})()
        self.device = type("Device", (), {"platform": "gpu", "client": client})()

    def devices(self):
        return {self.device}


def test_torch_host_tensors_are_described_without_a_device():
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    memory = torch_ops.describe(tensor, "allgather")
    assert (memory.address, memory.shape, memory.dtype) == (tensor.data_ptr(), (2, 3), "float32")
    assert (memory.device, memory.stream) == (-1, 0)


def test_torch_collectives_without_a_gpu_path_name_the_fix():
    tensor = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match=r"takes CPU tensors .*\.cpu\(\)"):
        torch_ops.describe(tensor, "alltoall")
    with pytest.raises(ValueError, match="takes CPU and CUDA tensors"):
        torch_ops.describe(tensor, "allreduce")
    assert set(torch_ops.GPU_COLLECTIVES) == {"allreduce", "broadcast", "reducescatter",
                                              "allgather"}


def test_jax_arrays_on_a_platform_without_a_handler_get_an_error_naming_the_fix():
    with pytest.raises(ValueError, match="JAX_PLATFORMS=cpu"):
        jax_ops._require_supported_arrays([StandInTpuArray()], "grads")
    jax_ops._require_supported_arrays([jax.numpy.ones(3)], "grads")  # host arrays pass
    assert set(jax_ops.PLATFORMS) == {"cpu", "gpu"}


def test_jax_arrays_on_an_amd_gpu_get_the_error_too():
    with pytest.raises(ValueError, match=r"\['rocm'\].*NVIDIA GPU"):
        jax_ops._require_supported_arrays([StandInGpuArray("rocm 60300")], "grads")
    jax_ops._require_supported_arrays([StandInGpuArray("PJRT C API\ncuda 13000")], "grads")

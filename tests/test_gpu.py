"""The GPU tests: the collectives, fusion and training on GPUs through NCCL.

They run where the op library has its GPU part and CUDA finds GPUs; anywhere
else each says why it skipped (on the CI machine: no NVIDIA driver). With
HVDKERAS_TEST_DEVICE=GPU the per-rank sessions pin one GPU per rank
(tests/parallel/conftest.py), so TensorFlow places the collectives on the
GPU:
- the regular tests/parallel files (every reduction and dtype, bfloat16
  included; broadcast, gathers, scatters; large tensors) on the GPU;
- the XLA files (tests/parallel/test_xla.py, keras_parallel/test_xla_training.py)
  with HVDKERAS_XLA_GPU=1, so the collectives run as CUDA custom calls;
- tests/parallel/gpu_ops.py: the results stay on the GPU, packing over odd
  sizes and alignments and past one copy launch, CPU and GPU tensors in one
  step;
- tests/keras_parallel/test_equivalence.py and test_compression.py: N ranks
  train like one process on the global batch, with fp16/bf16 compression;
- the bandwidth probe (examples/gpu_bandwidth_probe.py) runs and prints its
  ratios (the numbers are for reading, not asserted);
- a peer killed while the other rank is inside a large NCCL allreduce ends
  the job within the stall bound (tests/scripts/gpu_peer_death.py);
- process sets on the GPU (tests/parallel/test_process_sets.py).
A host whose driver shows GPUs fails these tests when the op library cannot
use them (a CPU-only build), rather than skipping.
Two ranks need two GPUs.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from hvdkeras.engine import c_api, library
from hvdkeras.gpu import nvml
from mpi_runner import (TEST_DEVICE, assert_every_rank_passed, describe, run_pytest_under_mpi,
                        run_under_mpi)

TESTS = Path(__file__).resolve().parent
PER_RANK_FILES = [TESTS / "parallel" / name for name in (
    "gpu_ops.py", "test_allreduce.py", "test_allreduce_large.py", "test_broadcast.py",
    "test_gather_scatter.py", "test_gradients.py", "test_join.py", "test_process_sets.py",
    "test_xla.py")] + [
    TESTS / "keras_parallel" / name for name in ("test_equivalence.py", "test_compression.py",
                                                 "test_xla_training.py")]
TIMEOUT_S = 420
# HVDKERAS_XLA_GPU=1: the XLA files run the collectives' CUDA custom-call targets.
GPU_ENV = {TEST_DEVICE: "GPU", "HVDKERAS_STALL_SHUTDOWN_SECONDS": "60", "HVDKERAS_XLA_GPU": "1"}


def _gpus() -> int:
    """GPUs the op library can use here; skips the test with the reason if none.

    A machine whose driver shows GPUs (NVML) while the library cannot use
    them (built without its GPU part, or a runtime it cannot load) fails
    instead: a silent CPU-only build must not pass as "no GPU here".
    """
    count, description = c_api.gpu_probe(library.handle())
    if count < 1:
        physical = nvml.device_count()
        if physical > 0:
            pytest.fail(f"NVML sees {physical} GPU(s) but the op library cannot use them: "
                        f"{description}")
        pytest.skip(f"no GPU test here: {description}")
    return count


def test_per_rank_files_exist():
    assert all(path.is_file() for path in PER_RANK_FILES)


@pytest.mark.usefixtures("op_library_built")
@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("test_file", PER_RANK_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("np", (1, 2), ids=lambda n: f"np{n}")
def test_on_gpus(np, test_file):
    gpus = _gpus()
    if gpus < np:
        pytest.skip(f"{np} ranks need {np} GPUs; this machine has {gpus}")
    result, reports = run_pytest_under_mpi(np, test_file, timeout=TIMEOUT_S, env=GPU_ENV)
    assert_every_rank_passed(np, result, reports)


@pytest.mark.usefixtures("op_library_built")
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_bandwidth_probe_runs():
    ranks = min(_gpus(), 2)
    result = run_under_mpi(ranks, [str(TESTS.parent / "examples" / "gpu_bandwidth_probe.py"),
                                   "--iterations", "10"], timeout=TIMEOUT_S, env=GPU_ENV)
    assert result.returncode == 0, describe(result)
    output = result.ranks[0].stdout
    print(output)  # the measurements, for the closing notes
    assert "packed GB/s" in output and "busbw GB/s" in output, output
    sys.stdout.flush()


PEER_DEATH_BOUND_S = 20


@pytest.mark.usefixtures("op_library_built")
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_a_killed_peer_ends_a_gpu_job_within_the_bound():
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    start = time.time()
    result = run_under_mpi(2, [str(TESTS / "scripts" / "gpu_peer_death.py")], timeout=TIMEOUT_S,
                           env={**GPU_ENV, "HVDKERAS_STALL_SHUTDOWN_SECONDS":
                                str(PEER_DEATH_BOUND_S)})
    ended = time.time()
    assert result.returncode != 0, describe(result)
    killed = re.search(r"KILLED_AT (\d+\.\d+)", result.stdout)
    assert killed, describe(result)
    assert ended - float(killed.group(1)) < PEER_DEATH_BOUND_S + 15, describe(result)
    assert "UNREACHABLE" not in result.stdout
    assert start < float(killed.group(1))

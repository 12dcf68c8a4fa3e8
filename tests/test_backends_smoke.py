"""The other Keras backends in the main suite: their collectives, exact per
rank, on 2 real ranks under torch and under jax. The rest of their tests
(3 ranks, training, the quickstart, recipes) is tests/test_backends.py, the
CI leg that runs when the time budget allows (scripts/test.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpi_runner import assert_every_rank_passed, describe, run_pytest_under_mpi, run_under_mpi
from test_backends import PARALLEL, TIMEOUT, backend_env

SCRIPTS = Path(__file__).parent / "scripts"
COLLECTIVES = next(p for p in PARALLEL if p.name == "test_backend_collectives.py")

pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow]


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_backend_collectives_on_two_ranks(backend):
    result, reports = run_pytest_under_mpi(
        2, COLLECTIVES, timeout=TIMEOUT, env=backend_env(backend),
        extra_args=["-rfE", "-W", "ignore::DeprecationWarning"])
    assert_every_rank_passed(2, result, reports)


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_init_and_collectives_leave_tensorflow_out(backend):
    """Under the other backends a rank that initialises, pins (no GPU here)
    and reduces never imports TensorFlow (its build flags come from a cached record)."""
    result = run_under_mpi(2, [str(SCRIPTS / "backend_without_tf_job.py")], timeout=TIMEOUT,
                           env=backend_env(backend))
    assert result.returncode == 0, describe(result)
    for rank, output in enumerate(result.ranks):
        assert f"rank {rank} pinned None sum [3.0, 3.0, 3.0] tensorflow_imported False" in output.stdout, \
            output.stdout + output.stderr


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("backend,zero_stage", [("torch", 2), ("jax", 1)])
def test_a_training_run_with_checkpoints_leaves_tensorflow_out(backend, zero_stage, tmp_path):
    """Distributed optimizer (fp16 wire, sharded state), the standard callbacks,
    rank-0 checkpoints, resuming, `load_model` and the object collectives
    run with TensorFlow unimportable, and hvdkeras never tries to import it."""
    result = run_under_mpi(2, [str(SCRIPTS / "backend_training_without_tf_job.py"),
                               str(tmp_path), str(zero_stage)], timeout=TIMEOUT,
                           env=backend_env(backend))
    assert result.returncode == 0, describe(result)
    for rank, output in enumerate(result.ranks):
        assert f"rank {rank} tensorflow_imported False hvdkeras_tried []" in output.stdout, \
            output.stdout + output.stderr


@pytest.mark.timeout(TIMEOUT + 60)
def test_torch_reduces_during_backward_across_hosts():
    """`HVDKERAS_TORCH_BACKWARD_OVERLAP=auto` turns on with ranks on two
    (simulated) hosts, and the results stay exact."""
    overlap = next(p for p in PARALLEL if p.name == "test_torch_overlap_specific.py")
    result, reports = run_pytest_under_mpi(
        2, overlap, timeout=TIMEOUT, env=backend_env("torch"), hosts="h0:1,h1:1",
        extra_args=["-rfE", "-W", "ignore::DeprecationWarning", "-k", "auto or bucket"])
    assert_every_rank_passed(2, result, reports)

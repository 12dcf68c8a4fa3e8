"""Sharded optimizer state and weights (ZeRO stages 1 to 3) beyond 2 ranks: the Keras
files of tests/keras_parallel/ on 4 ranks, and checkpoints written at one
rank count resumed at another. (At 2 ranks those files run in
tests/test_keras_mpi.py; the planner's unit tests are in
test_sharding_plan.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from mpi_runner import assert_every_rank_passed, describe, run_pytest_under_mpi, run_under_mpi

TESTS = Path(__file__).resolve().parent
FILES = ["test_zero_optimizers.py", "test_zero_training.py"]
TIMEOUT = 600
# At 4 ranks by default only the cases whose outcome can depend on how many
# ranks share the state (layouts, ownership, cut variables, resuming);
# those whose subject is the same at any rank count (refusals, which rank
# saves, the loop around the step) run at 2 ranks in tests/test_keras_mpi.py.
# HVDKERAS_ZERO_FOUR_RANKS_EVERYTHING=1 runs every case at 4 ranks too
# (the optimizer-by-optimizer file reads it as well).
EVERYTHING = os.environ.get("HVDKERAS_ZERO_FOUR_RANKS_EVERYTHING") == "1"
RANK_COUNT_FREE = {
    "test_zero_training.py": ("rank_zero_alone_cannot_save", "best_model_checkpoint",
                              "stage_three_refuses", "steps_per_execution"),
    "test_zero_optimizers.py": ("bad_settings_are_named", "inside_a_tf_function"),
}

pytestmark = pytest.mark.usefixtures("op_library_built")


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("name", FILES)
def test_zero_files_at_four_ranks(name):
    selection = [] if EVERYTHING else [
        "-k", " and ".join(f"not {test}" for test in RANK_COUNT_FREE[name])]
    result, reports = run_pytest_under_mpi(
        4, TESTS / "keras_parallel" / name, timeout=TIMEOUT,
        extra_args=["-rfE", "-W", "ignore::DeprecationWarning", *selection])
    assert_every_rank_passed(4, result, reports)


@pytest.mark.slow
@pytest.mark.timeout(5 * 240 + 60)
def test_a_checkpoint_saved_at_two_ranks_resumes_at_three(tmp_path):
    script = str(TESTS / "keras_mpi" / "zero_reshard.py")
    directory = str(tmp_path / "ckpt")
    saved = run_under_mpi(2, [script, "save", directory], timeout=240)
    assert saved.returncode == 0, describe(saved)
    finals = {}
    for stage in (0, 1, 2, 3):
        out = str(tmp_path / f"final{stage}.npz")
        resumed = run_under_mpi(3, [script, "resume", directory, str(stage), out], timeout=240)
        assert resumed.returncode == 0, describe(resumed)
        assert "restored" in describe(resumed) or stage == 0, describe(resumed)
        with np.load(out) as data:
            finals[stage] = [data[k] for k in data.files]
    for stage in (1, 2, 3):
        for got, want in zip(finals[stage], finals[0]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

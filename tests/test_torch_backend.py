"""The PyTorch backend (KERAS_BACKEND=torch) on real MPI processes.

* Each file in tests/torch_parallel/ runs as its own pytest session on every
  rank, at 2 and at 3 ranks: the collectives exact per rank, `model.fit`
  equal to one process on the global batch.
* A user's script (examples/keras_any_backend.py) trains with `hvdkerasrun
  -np 2` under the torch backend, unchanged from TensorFlow's.

Skipped, saying so, where torch is not installed (`pip install -e ".[torch]"`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mpi_runner import assert_every_rank_passed, describe, run_command, run_pytest_under_mpi

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PARALLEL = sorted((TESTS / "torch_parallel").glob("test_*.py"))
TIMEOUT = 240
TORCH = {"KERAS_BACKEND": "torch", "HVDKERAS_STALL_SHUTDOWN_SECONDS": "120"}

pytestmark = [
    pytest.mark.usefixtures("op_library_built"),
    pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                       reason="torch is not installed: pip install -e '.[torch]'"),
]


def test_torch_parallel_files_found():
    assert {"test_torch_collectives.py", "test_torch_training.py"} <= {p.name for p in PARALLEL}


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("test_file", PARALLEL, ids=[p.stem for p in PARALLEL])
def test_torch_parallel_file(test_file, ranks):
    result, reports = run_pytest_under_mpi(
        ranks, test_file, timeout=TIMEOUT, env=TORCH,
        extra_args=["-rfE", "-W", "ignore::DeprecationWarning"])
    assert_every_rank_passed(ranks, result, reports)


HVDKERASRUN = Path(sys.executable).parent / "hvdkerasrun"


@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_the_quickstart_script_trains_unchanged_and_resumes(tmp_path):
    """The README's quickstart, not one line changed, under `hvdkerasrun -np 2`:
    it trains, checkpoints on rank 0, and a second run resumes from there."""
    script = REPO / "examples" / "keras_quickstart.py"
    ckpt = tmp_path / "ckpt"
    first = run_command([str(HVDKERASRUN), "-np", "2", sys.executable, str(script), "--epochs",
                         "2", "--checkpoint-dir", str(ckpt)], timeout=TIMEOUT, env=TORCH)
    assert first.returncode == 0, describe(first)
    accuracy = float(first.stdout.split("test accuracy:")[1].split()[0])
    assert accuracy > 0.9, first.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-00001.keras", "epoch-00002.keras"]
    again = run_command([str(HVDKERASRUN), "-np", "2", sys.executable, str(script), "--epochs",
                         "3", "--checkpoint-dir", str(ckpt)], timeout=TIMEOUT, env=TORCH)
    assert again.returncode == 0, describe(again)
    assert "continuing at epoch 3" in again.stdout and "Epoch 3/3" in again.stdout
    assert "Epoch 1/3" not in again.stdout


@pytest.mark.timeout(TIMEOUT + 60)
def test_a_recipe_trains_with_backend_torch(tmp_path):
    from recipe_helpers import train  # lazy: only this test launches a recipe

    _, summary = train(REPO / "recipes" / "digits.yaml", "backend=torch", "training.epochs=4",
                       summary=tmp_path / "summary.json", cwd=tmp_path, timeout=TIMEOUT)
    assert summary["ranks"] == 2 and summary["epochs_run"] == 4
    assert summary["final"]["val_accuracy"] >= 0.9, summary["history"]

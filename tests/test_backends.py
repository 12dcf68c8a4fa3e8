"""Keras's other backends (KERAS_BACKEND=torch and =jax) on real MPI processes.

* Each file in tests/backends_parallel/ runs as its own pytest session on
  every rank, at 2 and at 3 ranks, under each backend: the collectives exact
  per rank, `model.fit` equal to one process on the global batch, and what
  only one binding does (autograd and torch.compile; jit and custom_vjp).
* The README's quickstart (examples/keras_quickstart.py), unchanged, trains
  and resumes with `hvdkerasrun -np 2` under each backend.
* A recipe trains with `backend: torch` / `backend: jax` (and `zero_stage: 3`).

A backend whose framework is not installed is skipped, saying so
(`pip install -e ".[torch]"` / `".[jax]"`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mpi_runner import assert_every_rank_passed, describe, run_command, run_pytest_under_mpi

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
ALL_FILES = sorted((TESTS / "backends_parallel").glob("test_*.py"))
# Files that run in the session of another (one job start each, where the
# ranks' imports are most of the cost).
COMPANIONS = {"test_backend_training": ["test_backend_layers_and_policies"],
              "test_torch_specific": ["test_torch_optim_specific"]}
PARALLEL = [p for p in ALL_FILES
            if p.stem not in {c for group in COMPANIONS.values() for c in group}]
TIMEOUT = 240
HVDKERASRUN = Path(sys.executable).parent / "hvdkerasrun"
BACKENDS = ["torch", "jax"]

# Slow: jobs of real ranks. scripts/test.sh runs this file as its own CI leg.
pytestmark = [pytest.mark.usefixtures("op_library_built"), pytest.mark.slow]


def backend_env(backend: str) -> dict:
    if importlib.util.find_spec(backend) is None:
        pytest.skip(f"{backend} is not installed: pip install -e '.[{backend}]'")
    return {"KERAS_BACKEND": backend, "HVDKERAS_STALL_SHUTDOWN_SECONDS": "120"}


def test_backend_files_found():
    assert {"test_backend_collectives.py", "test_backend_training.py", "test_torch_specific.py",
            "test_jax_specific.py"} <= {p.name for p in PARALLEL}
    assert {f"{c}.py" for group in COMPANIONS.values() for c in group} <= \
        {p.name for p in ALL_FILES}


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("test_file", PARALLEL, ids=[p.stem for p in PARALLEL])
@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_parallel_file(backend, test_file, ranks):
    if test_file.stem.endswith("_specific") and not test_file.stem.startswith(f"test_{backend}"):
        pytest.skip(f"{test_file.name} is for another backend")
    if test_file.stem == "test_backend_training" and ranks != 2:
        pytest.skip("training equivalence runs at 2 ranks (the collectives at 2 and 3)")
    files = [test_file] + [test_file.parent / f"{c}.py" for c in COMPANIONS.get(test_file.stem, [])]
    result, reports = run_pytest_under_mpi(
        ranks, files, timeout=TIMEOUT, env=backend_env(backend),
        extra_args=["-rfE", "-W", "ignore::DeprecationWarning"])
    assert_every_rank_passed(ranks, result, reports)


@pytest.mark.timeout(2 * TIMEOUT + 60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_quickstart_script_trains_unchanged_and_resumes(backend, tmp_path):
    """The README's quickstart, not one line changed, under `hvdkerasrun -np 2`:
    it trains, checkpoints on rank 0, and a second run resumes from there."""
    env = backend_env(backend)
    script = REPO / "examples" / "keras_quickstart.py"
    ckpt = tmp_path / "ckpt"
    first = run_command([str(HVDKERASRUN), "-np", "2", sys.executable, str(script), "--epochs",
                         "2", "--checkpoint-dir", str(ckpt)], timeout=TIMEOUT, env=env)
    assert first.returncode == 0, describe(first)
    accuracy = float(first.stdout.split("test accuracy:")[1].split()[0])
    assert accuracy > 0.9, first.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-00001.keras", "epoch-00002.keras"]
    again = run_command([str(HVDKERASRUN), "-np", "2", sys.executable, str(script), "--epochs",
                         "3", "--checkpoint-dir", str(ckpt)], timeout=TIMEOUT, env=env)
    assert again.returncode == 0, describe(again)
    assert "continuing at epoch 3" in again.stdout and "Epoch 3/3" in again.stdout
    assert "Epoch 1/3" not in again.stdout


@pytest.mark.timeout(TIMEOUT + 60)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_recipe_trains_with_its_backend(backend, tmp_path):
    from recipe_helpers import train  # lazy: only this test launches a recipe

    backend_env(backend)  # skips when the framework is missing
    # With sharded weights and optimizer state (ZeRO stage 3): the recipe's
    # way to it under every backend.
    _, summary = train(REPO / "recipes" / "digits.yaml", f"backend={backend}",
                       "training.epochs=4", "training.zero_stage=3",
                       summary=tmp_path / "summary.json", cwd=tmp_path, timeout=TIMEOUT)
    assert summary["ranks"] == 2 and summary["epochs_run"] == 4
    assert summary["final"]["val_accuracy"] >= 0.9, summary["history"]

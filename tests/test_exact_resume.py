"""Exact resume (Note [exact resume] in hvdkeras/training/resume_state.py), for real:
a 2-rank recipe with Dropout and shuffling on is SIGKILLed at a random step,
started again, resumes from its newest checkpoint (mid-epoch ones included)
and ends with the same weights and optimizer state, bit for bit, as an
uninterrupted run of the same recipe.

One seed (one kill step) runs by default, to keep the default CI run near
45 minutes; the long variant, `HVDKERAS_RESUME_SEEDS=N`, runs N (the second
is 29, then random ones; each costs about 40 s in a full CI run here).
"""

from __future__ import annotations

import os
import random
import re
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_runner import describe, run_command

TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
TIMEOUT = 300
STEPS_PER_EPOCH = 25  # 1797 digits, 10% held out, over 2 ranks, batch 32
EPOCHS = 3
EVERY_STEPS = 7
SEED_COUNT = max(1, int(os.environ.get("HVDKERAS_RESUME_SEEDS", "1")))
SEEDS = ([11, 29] + random.Random(0).sample(range(100, 10_000), max(0, SEED_COUNT - 2)))[
    :SEED_COUNT]

RECIPE = """\
version: 1
seed: {seed}
model: {{name: "resume_model:build", args: {{dropout: 0.3}}}}
data:
  source: bundled
  layout: flat
  batch_size: 32
  shuffle: true
  validation: {{split: 0.1}}
optimizer: {{name: adam, learning_rate: 1e-3}}
training: {{epochs: {epochs}, verbose: 0}}
checkpoint: {{dir: {directory}, every_steps: {every}, keep: null}}
"""

pytestmark = pytest.mark.usefixtures("op_library_built")


def _train(recipe, **env):
    full = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS / "scripts"),
                                                        os.environ.get("PYTHONPATH")])),
            **env}
    return run_command([str(BIN / "hvdkeras"), "train", str(recipe), "--np", "2"],
                       timeout=TIMEOUT, env=full)


def _arrays(path):
    """Every array of a .keras archive's weights file (model and optimizer), by name."""
    import zipfile

    with zipfile.ZipFile(path) as archive, archive.open("model.weights.h5") as raw:
        with h5py.File(raw, "r") as h5:
            found = {}
            h5.visititems(lambda name, item: found.__setitem__(name, item[()])
                          if isinstance(item, h5py.Dataset) else None)
            return found


@pytest.mark.slow
@pytest.mark.timeout(4 * TIMEOUT)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_run_killed_at_a_random_step_resumes_exactly(tmp_path, seed):
    kill_step = random.Random(seed).randrange(EVERY_STEPS + 1, EPOCHS * STEPS_PER_EPOCH - 2)
    recipes = {}
    for name in ("uninterrupted", "killed"):
        recipes[name] = tmp_path / f"{name}.yaml"
        recipes[name].write_text(RECIPE.format(seed=seed, epochs=EPOCHS, every=EVERY_STEPS,
                                               directory=tmp_path / name))
    reference = _train(recipes["uninterrupted"])
    assert reference.returncode == 0, describe(reference)

    killed = _train(recipes["killed"], RESUME_TEST_KILL=f"1:{kill_step}")
    assert killed.returncode != 0, describe(killed)
    assert f"KILLING rank at step {kill_step}" in killed.stdout, describe(killed)
    assert not (tmp_path / "killed" / f"epoch-{EPOCHS:05d}.keras").exists()

    resumed = _train(recipes["killed"])
    assert resumed.returncode == 0, describe(resumed)
    # The newest checkpoint before the kill: every EVERY_STEPS steps and at epoch ends.
    done = kill_step - 1
    epoch, step = divmod(done, STEPS_PER_EPOCH)
    step -= step % EVERY_STEPS
    where = f"continuing at epoch {epoch + 1}" + (f" step {step + 1}." if step else ".")
    assert re.search(rf"resumed from \S+: {re.escape(where)}", resumed.stdout), (
        f"expected {where!r}\n" + describe(resumed))

    final = f"epoch-{EPOCHS:05d}.keras"
    expected = _arrays(tmp_path / "uninterrupted" / final)
    got = _arrays(tmp_path / "killed" / final)
    assert sorted(got) == sorted(expected)
    assert any("optimizer" in name for name in expected)  # slots and iterations are compared too
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)

"""Launches the Keras integration tests on 2 real MPI processes.

* tests/keras_parallel/ runs as two pytest sessions on both ranks (each
  job start costs every rank a TensorFlow import: about 10 s of this
  machine's two cores per file); HVDKERAS_KERAS_PER_FILE=1 runs one session
  per file instead, so a failure in one file leaves the others running.
* The scripts in tests/keras_mpi/ play whole jobs: stopped, crashed while
  writing a checkpoint, restarted; saved models loaded in a process that
  never imports hvdkeras; the quickstart example.

Every job runs under a timeout that kills its whole process group, and each
rank's output is read on its own (see Note [one file per rank] in
mpi_runner.py).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mpi_runner import (assert_every_rank_passed, describe, run_pytest_under_mpi, run_python,
                        run_under_mpi)

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
PARALLEL = sorted((TESTS / "keras_parallel").glob("test_*.py"))
PER_FILE = os.environ.get("HVDKERAS_KERAS_PER_FILE") == "1"
# TensorFlow's op determinism, once on, stays on for the process (and Keras
# then turns XLA off): the files that turn it on at import share a session,
# the others another, so each file runs as it would alone.
DETERMINISTIC = [p for p in PARALLEL if "enable_op_determinism()" in p.read_text()]
SESSIONS = ({p.stem: [p] for p in PARALLEL} if PER_FILE else
            {"deterministic": DETERMINISTIC,
             "others": [p for p in PARALLEL if p not in DETERMINISTIC]})
SCRIPTS = TESTS / "keras_mpi"
# Backstop against hangs (the op library is built before any job starts).
TIMEOUT = 240
# A session over many files: the larger takes about 100 s here.
SUITE_TIMEOUT = 900




pytestmark = pytest.mark.usefixtures("op_library_built")


def test_keras_parallel_files_found():
    """Guards against the parametrization below silently becoming empty."""
    assert {"test_all_optimizers.py", "test_callbacks.py", "test_checkpoint.py",
            "test_compression.py",
            "test_equivalence.py", "test_guards.py"} <= {p.name for p in PARALLEL}


def _ok(result):
    assert result.returncode == 0, describe(result)
    return result


@pytest.mark.slow
@pytest.mark.timeout(SUITE_TIMEOUT + 60)
@pytest.mark.parametrize("session", sorted(SESSIONS))
def test_keras_parallel_file(session):
    """The files of tests/keras_parallel/ in `session` pass on both ranks."""
    # -x: a rank that fails exits; its shutdown fails the other rank's next
    # collective instead of leaving it waiting.
    result, reports = run_pytest_under_mpi(
        2, SESSIONS[session], timeout=TIMEOUT if PER_FILE else SUITE_TIMEOUT,
        extra_args=["-rfE", "-W", "ignore::DeprecationWarning"])
    assert_every_rank_passed(2, result, reports)


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_sparse_lookups_and_data_shards_at_three_ranks():
    """Each kind of lookup, and the data-sharding helpers, at 3 ranks (the
    2-rank session runs both files whole): an odd rank count, where a shared
    table's rows come from three ranks and rows split three ways."""
    result, reports = run_pytest_under_mpi(
        3, [TESTS / "keras_parallel" / "test_sparse_lookups.py",
            TESTS / "keras_parallel" / "test_data_shards.py"], timeout=TIMEOUT,
        extra_args=["-rfE", "-W", "ignore::DeprecationWarning", "-k",
                    "each_kind or shared_table or zero_stages or test_data_shards"])
    assert_every_rank_passed(3, result, reports)


def _train(*args):
    return run_under_mpi(2, [str(SCRIPTS / "resume_training.py"), *map(str, args)],
                         timeout=TIMEOUT)


def _final_state(path):
    with np.load(path) as data:
        return int(data["initial_epoch"]), [data[k] for k in data.files if k.startswith("arr_")]


@pytest.mark.slow
@pytest.mark.timeout(4 * TIMEOUT + 60)
def test_stop_crash_and_restart_match_an_uninterrupted_run(tmp_path):
    ckpt = tmp_path / "ckpt"
    _ok(_train("--epochs", 4, "--out", tmp_path / "uninterrupted.npz"))

    # Run 1 stops cleanly after epoch 2.
    _ok(_train("--dir", ckpt, "--epochs", 2))
    assert sorted(os.listdir(ckpt)) == ["epoch-00001.keras", "epoch-00002.keras"]

    # Run 2 resumes at epoch 3 and is killed while writing epoch 3's checkpoint.
    crashed = _train("--dir", ckpt, "--epochs", 4, "--resume", "--crash-writing-epoch", 3)
    assert crashed.returncode != 0, describe(crashed)
    assert "continuing at epoch 3" in crashed.ranks[0].stdout, describe(crashed)
    assert "crashing while writing the checkpoint of epoch 3" in crashed.ranks[0].stdout
    names = sorted(os.listdir(ckpt))
    partial = [n for n in names if n.startswith(".tmp-") and n.endswith("epoch-00003.keras")]
    assert len(partial) == 1 and "epoch-00003.keras" not in names, names
    assert not zipfile.is_zipfile(ckpt / partial[0]), "the interrupted write was not partial"

    # Run 3 resumes from epoch 2's checkpoint (still complete) and finishes.
    out = _ok(_train("--dir", ckpt, "--epochs", 4, "--resume", "--out", tmp_path / "resumed.npz"))
    rank0 = out.ranks[0].stdout
    assert "resumed from" in rank0 and "epoch-00002.keras: continuing at epoch 3" in rank0, rank0
    assert sorted(os.listdir(ckpt)) == ["epoch-00002.keras", "epoch-00003.keras",
                                        "epoch-00004.keras"]   # keep_last=3, temp file gone

    start, resumed = _final_state(tmp_path / "resumed.npz")
    _, uninterrupted = _final_state(tmp_path / "uninterrupted.npz")
    assert start == 2
    assert len(resumed) == len(uninterrupted)
    for got, want in zip(resumed, uninterrupted):   # weights, then optimizer state
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT + 60)
def test_saved_models_load_with_and_without_hvdkeras(tmp_path):
    out = _ok(run_under_mpi(2, [str(SCRIPTS / "save_models.py"), str(tmp_path)],
                            timeout=TIMEOUT))
    assert [rank.stdout.count("round trip with hvdkeras ok") for rank in out.ranks] == [3, 3], \
        out.stdout
    out = _ok(run_python([str(SCRIPTS / "load_without_hvdkeras.py"), str(tmp_path)],
                         timeout=TIMEOUT)).stdout
    assert "hvdkeras never imported" in out, out


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_quickstart_example_trains_and_only_rank_zero_prints(tmp_path):
    result = _ok(run_under_mpi(2, [str(REPO / "examples" / "keras_quickstart.py"), "--epochs",
                                   "2", "--checkpoint-dir", str(tmp_path / "ckpt")],
                               timeout=TIMEOUT))
    out = result.stdout
    ranks = [rank.stdout.splitlines() for rank in result.ranks]
    assert [sum(line.startswith("Epoch 1/2") for line in lines) for lines in ranks] == [1, 0], out
    assert [sum(line.startswith("test accuracy") for line in lines) for lines in ranks] == [1, 0]
    accuracy = float(next(line for line in ranks[0] if line.startswith("test accuracy")).split()[-1])
    assert accuracy > 0.9, out
    # verbose=2 on a pipe: one summary line per epoch, no progress-bar redraws.
    assert not any("\r" in line or "\x08" in line for lines in ranks for line in lines), out
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["epoch-00001.keras", "epoch-00002.keras"]

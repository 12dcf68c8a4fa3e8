"""hvdkeras.ray.run on a real local Ray cluster (started here with
`ray.init(num_cpus=...)`): results from every rank, a rank that raises, a rank
that dies, ranks that cannot be placed, a run past its timeout, and bad
arguments refused before anything starts."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from hvdkeras.ray.runner import check_arguments
from hvdkeras.runner.function_runner import RankFailedError
from mpi_runner import describe, run_command

ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'hvdkeras[ray]')")
import hvdkeras.ray  # noqa: E402  (after the skip: it needs nothing from ray at import)

JOB_TIMEOUT = 180


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True)
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_every_rank_returns_its_result(cluster):
    def fn(offset):
        import hvdkeras as hvd
        total = hvd.allreduce([float(hvd.rank() + offset)], op=hvd.Sum, name="ray_sum")
        return hvd.rank(), hvd.size(), float(total[0])

    # Ranks 0 and 1 contribute 1 and 2.
    assert hvdkeras.ray.run(fn, args=(1,), num_proc=2, timeout=JOB_TIMEOUT) == [
        (0, 2, 3.0), (1, 2, 3.0)]


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_a_rank_that_raises_ends_the_run_with_its_traceback(cluster):
    def _ray_failure(rank):
        raise KeyError(f"no shard for rank {rank}")

    def fn():
        import hvdkeras as hvd
        if hvd.rank() == 1:
            _ray_failure(hvd.rank())
        hvd.allreduce([1.0], name="rank_0_waits_here")  # would wait forever without fail-fast

    started = time.time()
    with pytest.raises(RankFailedError) as info:
        hvdkeras.ray.run(fn, num_proc=2, timeout=JOB_TIMEOUT)
    assert time.time() - started < JOB_TIMEOUT / 2
    assert info.value.rank == 1
    assert str(info.value).startswith("rank 1 of 2 raised KeyError")
    assert "in _ray_failure" in str(info.value)


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_a_rank_that_dies_ends_the_run(cluster):
    def fn():
        import os

        import hvdkeras as hvd
        if hvd.rank() == 1:
            os._exit(7)
        hvd.allreduce([1.0], name="rank_0_waits_for_a_dead_rank")

    started = time.time()
    with pytest.raises(RankFailedError) as info:
        hvdkeras.ray.run(fn, num_proc=2, timeout=JOB_TIMEOUT)
    assert time.time() - started < JOB_TIMEOUT / 2
    assert "rank 1 exited with code 7" in str(info.value)


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_ranks_that_cannot_be_placed_say_so(cluster):
    with pytest.raises(RankFailedError, match="could not place 2 ranks of .*'CPU': 64.0"):
        hvdkeras.ray.run(lambda: None, num_proc=2, cpus_per_rank=64, start_timeout=3)


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_a_run_past_its_timeout_is_ended(cluster):
    def fn():
        import time
        time.sleep(600)

    started = time.time()
    with pytest.raises(RankFailedError, match="timed out after 5 s"):
        hvdkeras.ray.run(fn, num_proc=2, timeout=5)
    assert time.time() - started < 60


@pytest.mark.parametrize("arguments, words", [
    (dict(num_proc=0), "num_proc"), (dict(num_proc=True), "num_proc"),
    (dict(placement="CLOSE"), "placement"), (dict(cpus_per_rank=0), "cpus_per_rank"),
    (dict(gpus_per_rank=-1), "gpus_per_rank"), (dict(timeout=0), "timeout"),
    (dict(start_timeout="soon"), "start_timeout"),
])
def test_bad_arguments_are_refused_before_anything_starts(arguments, words):
    full = dict(num_proc=2, placement="SPREAD", cpus_per_rank=1, gpus_per_rank=0,
                timeout=None, start_timeout=None)
    full.update(arguments)
    with pytest.raises(ValueError, match=words):
        check_arguments(**full)


HVDKERAS = Path(sys.executable).parent / "hvdkeras"


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_hvdkeras_train_runs_a_recipe_on_ray_actors(cluster, tmp_path):
    """`hvdkeras train --engine ray` in its own process, joining this test's
    cluster through RAY_ADDRESS. The cluster's workers start where the
    cluster was started (here the test session's directory); the run must
    still land where the command was given."""
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)
    summary = tmp_path / "summary.json"
    result = run_command([str(HVDKERAS), "train", "digits", "--engine", "ray", "--np", "2",
                          "--set", "training.epochs=1", "--summary-json", str(summary)],
                         timeout=JOB_TIMEOUT, env=env, cwd=tmp_path)
    assert result.returncode == 0, describe(result)
    data = json.loads(summary.read_text())
    assert data["ranks"] == 2 and data["epochs_run"] == 1, data
    assert (tmp_path / "runs" / "digits" / "checkpoints" / "epoch-00001.keras").is_file()
    assert "finished in" in result.stdout, describe(result)


def test_hvdkeras_train_on_ray_refuses_launcher_options(tmp_path):
    result = run_command([str(HVDKERAS), "train", "digits", "--engine", "ray", "--np", "2",
                          "--hosts", "a:2"], timeout=120, cwd=tmp_path)
    assert result.returncode == 2, describe(result)
    assert "--hosts do not apply with --engine ray" in result.stdout, describe(result)

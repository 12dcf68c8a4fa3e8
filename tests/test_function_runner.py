"""`hvdkeras.run` / `hvdkeras.Runner`: functions on 2 real MPI ranks, results back here.

Each call starts a real job through `hvdkerasrun`'s machinery and is bounded
by `timeout=` (the job's process group is killed when it runs over).
"""

from __future__ import annotations

import time

import pytest

import hvdkeras
from hvdkeras import RankFailedError

JOB_TIMEOUT = 240



pytestmark = pytest.mark.usefixtures("op_library_built")


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_closure_over_local_data_returns_per_rank_results():
    shards = {0: [1.0, 2.0, 3.0], 1: [10.0, 20.0]}  # local data the closure captures
    scale = 3

    def train(offset):
        import hvdkeras as hvd

        hvd.init()
        rank = hvd.rank()
        local = sum(shards[rank]) * scale + offset
        total = hvd.allreduce([local], op=hvd.Sum, name="total")
        return {"rank": rank, "size": hvd.size(), "local": local, "total": float(total.numpy()[0])}

    results = hvdkeras.run(train, args=(1.0,), np=2, return_all=True, timeout=JOB_TIMEOUT)
    assert results == [
        {"rank": 0, "size": 2, "local": 19.0, "total": 110.0},
        {"rank": 1, "size": 2, "local": 91.0, "total": 110.0},
    ]


@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_rank_zero_result_by_default_and_kwargs():
    """Without return_all, rank 0's value comes back (mpi4py only: a quick job)."""
    tag = object.__name__  # something from the caller's scope

    def whoami(suffix):
        from mpi4py import MPI

        return f"{tag}-{MPI.COMM_WORLD.Get_rank()}-of-{MPI.COMM_WORLD.Get_size()}-{suffix}"

    assert hvdkeras.Runner(2, timeout=JOB_TIMEOUT).run(whoami, suffix="x") == "object-0-of-2-x"


def _fail_on_rank_one(rank):
    raise ValueError(f"bad shard on rank {rank}")


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_exception_on_rank_one_surfaces_with_its_traceback():
    def train():
        import hvdkeras as hvd

        hvd.init()
        if hvd.rank() == 1:
            _fail_on_rank_one(hvd.rank())
        hvd.allreduce([1.0], name="rank_0_waits_here")  # rank 1 never joins
        return "unreachable"

    started = time.time()
    with pytest.raises(RankFailedError) as info:
        hvdkeras.Runner(np=2, timeout=JOB_TIMEOUT).run(train)
    error = info.value
    assert time.time() - started < JOB_TIMEOUT / 2
    assert error.rank == 1
    message = str(error)
    assert message.startswith("rank 1 of 2 raised ValueError: bad shard on rank 1")
    assert "Traceback on rank 1:" in message
    # The frames of the rank's own traceback, innermost last.
    assert message.index("in train") < message.index("in _fail_on_rank_one")
    assert message.rstrip().endswith("ValueError: bad shard on rank 1")
    assert isinstance(error.exception, ValueError) and error.__cause__ is error.exception
    assert "_fail_on_rank_one" in error.remote_traceback


@pytest.mark.slow
@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_a_failing_rank_ends_the_job_while_another_computes():
    """The failing rank aborts instead of waiting in MPI_Finalize for rank 0's 200 s."""
    def train():
        import time as clock

        import hvdkeras as hvd

        hvd.init()
        if hvd.rank() == 1:
            _fail_on_rank_one(hvd.rank())
        clock.sleep(200)  # outside any collective
        return "unreachable"

    started = time.time()
    with pytest.raises(RankFailedError) as info:
        hvdkeras.Runner(np=2, timeout=JOB_TIMEOUT).run(train)
    assert time.time() - started < 60  # start-up and TensorFlow import on 2 ranks, then at once
    assert info.value.rank == 1 and "bad shard on rank 1" in str(info.value)


def test_bad_arguments():
    with pytest.raises(ValueError, match="callable"):
        hvdkeras.run("not a function")
    with pytest.raises(ValueError, match="np must be a non-zero whole number"):
        hvdkeras.Runner(0)
    with pytest.raises(ValueError, match="timeout"):
        hvdkeras.run(print, np=1, timeout=0)
    with pytest.raises(ValueError, match="no Gloo"):
        hvdkeras.run(print, np=1, use_gloo=True)
    with pytest.raises(ValueError, match="always runs on MPI"):
        hvdkeras.run(print, np=1, use_mpi=False)
    with pytest.raises(ValueError, match="not both"):
        hvdkeras.run(print, np=1, output_dir="a", output_filename="b")
    with pytest.raises(ValueError, match="driver_log_verbosity"):
        hvdkeras.Runner(-2, driver_log_verbosity="loud")


def test_horovod_runner_placement_rule():
    """HorovodRunner: np > 0 on Spark (when there is one), np < 0 local."""
    from hvdkeras.spark.horovod_runner import runner_placement

    assert runner_placement(4, spark_active=True) == ("spark", 4)
    assert runner_placement(4, spark_active=False) == ("local", 4)
    assert runner_placement(-3, spark_active=True) == ("local", 3)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="np must be"):
            runner_placement(bad, spark_active=False)


@pytest.mark.timeout(JOB_TIMEOUT + 60)
def test_horovod_run_returns_every_rank_and_negative_np_runs_locally():
    def whoami(suffix=""):
        from mpi4py import MPI

        return f"{MPI.COMM_WORLD.Get_rank()}{suffix}"

    assert hvdkeras.run(whoami, np=2, timeout=JOB_TIMEOUT) == ["0", "1"]
    assert hvdkeras.Runner(-2, timeout=JOB_TIMEOUT).run(whoami, suffix="!") == "0!"

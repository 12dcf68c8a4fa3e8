"""The failure messages of the multi-rank test helper (pure: no MPI)."""

from __future__ import annotations

from mpi_runner import MpiResult, RankOutput, describe, error_lines


def test_each_ranks_error_lines_come_last_without_tensorflow_start_up_noise():
    noise = "E0000 00:00:1795679070.81 18349 cuda_platform.cc:52] failed call to cuInit: error\n"
    ranks = [RankOutput("ok\n", noise),
             RankOutput("", noise + "Traceback (most recent call last):\n  x\n"
                        "RuntimeError: rank 1 gave up\n"),
             RankOutput("", "hvdkeras: ERROR: rank 2's engine has stayed 11 s in one step\n")]
    assert error_lines(ranks).splitlines() == [
        "rank 0: (none)",
        "rank 1: Traceback (most recent call last): | RuntimeError: rank 1 gave up",
        "rank 2: hvdkeras: ERROR: rank 2's engine has stayed 11 s in one step"]
    message = describe(MpiResult(["mpiexec"], 1, "", ranks))
    assert message.endswith(error_lines(ranks))
    assert "exit status 1" in message

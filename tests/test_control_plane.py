"""The control plane on real framework-free MPI ranks, through
examples/control_plane_benchmark.py: a 5,000-tensor step stays on the cached
one-allreduce path under the default cache bound, and a cache too small for
the step says so (docs/scaling.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "examples"))

import control_plane_benchmark as bench  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_five_thousand_tensor_step_stays_on_the_cached_path():
    result = bench.run_real(ranks=2, tensors=5000, steps=2, extra_env={}, timeout=300)
    assert result["exact"], result
    assert result["cached_fraction"] == 1.0, result
    assert result["cache_evictions"] == 0, result
    assert "response cache is full" not in result["stderr"]


def test_a_cache_smaller_than_the_step_is_named_once_and_results_stay_exact():
    result = bench.run_real(ranks=2, tensors=1500, steps=2,
                            extra_env={"HVDKERAS_CACHE_CAPACITY": "1024"}, timeout=300)
    assert result["exact"], result
    assert result["cache_evictions"] > 0, result
    assert result["cached_fraction"] < 1.0, result
    assert result["stderr"].count("the response cache is full (1024 entries") == 1, \
        result["stderr"][-2000:]


def test_the_stand_in_at_a_thousand_ranks_agrees_and_counts_what_rank_zero_receives():
    """The stand-in (ops/core/virtual_ranks.h) runs the real negotiation for
    1,000 virtual ranks: every rank agrees, allgathers carry each rank's rows,
    the later steps are all cached, and rank 0 receives exactly one digest per
    other rank and request (Note [requests by signature hash])."""
    from hvdkeras.engine.control_plane_model import Link

    tensors, allgathers, ranks = 300, 10, 1000
    result = bench.run_simulated(ranks, tensors, steps=2, stragglers=2, allgathers=allgathers,
                                 cache_capacity=16384, ranks_per_host=8,
                                 link=Link(2e-6, 12.5e9))
    assert result["agreed"] and result["exact"], result
    assert result["rank0_caches"].startswith("cold"), result  # the default (Note [a cold rank 0])
    assert result["cached_fraction"] == 1.0, result
    assert result["steady_cycle_rank0_bytes_in"] == 0, result
    digest, own_rows = 8 + 8 + 4, 8  # hash, age, count; an allgather's first dimension
    expected = (ranks - 1) * (tensors * digest + allgathers * own_rows)
    assert result["first_step_rank0_bytes_in"] == expected, result
    assert result["rank0_liveness_sockets"] == ranks // 8 - 1, result


def test_the_real_first_step_sends_rank_zero_digests_not_requests():
    """On 4 real ranks the first step's bytes at rank 0 are the digests, plus
    at most one full request per tensor where rank 0 had not submitted it yet."""
    from hvdkeras.engine.control_plane_model import Link

    tensors = 300
    real = bench.run_real(ranks=4, tensors=tensors, steps=1, extra_env={}, timeout=300)
    simulated = bench.run_simulated(4, tensors, steps=1, stragglers=0, allgathers=0,
                                    cache_capacity=16384, ranks_per_host=8,
                                    link=Link(2e-6, 12.5e9))
    assert real["exact"] and simulated["exact"], (real, simulated)
    digests = simulated["first_step_rank0_bytes_in"]
    assert digests == 3 * tensors * 20, simulated
    assert digests <= real["first_step_rank0_bytes_in"] <= digests + tensors * 100, real
    # Rank 0's own negotiation CPU is counted by the engine as by the
    # stand-in, whose run for the same job comes back beside it.
    assert real["first_step_rank0_negotiation_cpu_s"] > 0, real
    prediction = bench.predict_real(real)
    assert prediction["predicted"]["first_step_rank0_bytes_in"] == digests, prediction
    assert all(v > 0 for v in prediction["real_over_predicted"].values()), prediction

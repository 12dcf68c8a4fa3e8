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

"""The control plane's cost model (hvdkeras/engine/control_plane_model.py):
pure arithmetic, checked against hand-worked numbers."""

from __future__ import annotations

import pytest

from hvdkeras.engine import control_plane_model as model

LINK = model.Link(latency_s=2e-6, bytes_per_s=1e9)


def test_tree_depth_is_the_rounds_of_a_binomial_tree():
    assert [model.tree_depth(n) for n in (1, 2, 3, 4, 5, 1024, 1025, 16384)] == \
        [0, 1, 2, 2, 3, 10, 11, 14]
    with pytest.raises(ValueError, match="at least 1"):
        model.tree_depth(0)


def test_each_collective_costs_its_rounds_and_its_bytes():
    # 16 ranks: 4 rounds.
    assert model.allreduce_s(16, 1000, LINK) == pytest.approx(4 * (2e-6 + 1e-6))
    assert model.gather_s(16, 10 ** 6, LINK) == pytest.approx(4 * 2e-6 + 1e-3)
    # A small broadcast goes down the tree; a large one scatters, then gathers.
    assert model.broadcast_s(16, 100, LINK) == pytest.approx(4 * (2e-6 + 1e-7))
    assert model.broadcast_s(16, 10 ** 8, LINK) == pytest.approx(8 * 2e-6 + 0.2)
    assert model.broadcast_s(1, 10 ** 8, LINK) == 0.0


def test_a_cycle_adds_rank_zeros_cpu_to_its_exchanges():
    row = [0, 0.5, 0, 3, 2, 160, 1, 5000, 1, 300]
    cycle = model.as_cycles([row])[0]
    assert cycle["gather_bytes_at_root"] == 5000
    expected = (0.5 + 2 * model.allreduce_s(8, 80, LINK) + model.gather_s(8, 0, LINK)
                + 5000 / 1e9 + model.broadcast_s(8, 300, LINK))
    assert model.cycle_seconds(cycle, 8, LINK) == pytest.approx(expected)


def test_the_summary_splits_the_first_step_from_the_steady_cycles():
    rows = [[0, 0.02, 0, 2, 1, 24, 2, 4000, 2, 500],
            [0, 0.01, 0, 2, 1, 24, 1, 1000, 1, 500],
            [1, 1e-4, 4, 0, 1, 24, 0, 0, 0, 0],
            [2, 3e-4, 3, 1, 1, 24, 1, 100, 1, 50]]
    report = {"cycles": rows, "agreed": True, "exact": True, "error": "",
              "rank0_table_peak_bytes": 2 ** 20, "rank0_liveness_sockets": 3}
    out = model.summarize(report, 8, 4, LINK)
    assert out["first_step_cycles"] == 2
    assert out["first_step_rank0_cpu_s"] == pytest.approx(0.03)
    assert out["first_step_rank0_bytes_in"] == 5000
    assert out["steady_cycle_rank0_cpu_us"] == pytest.approx(200.0)
    assert out["steady_cycle_rank0_bytes_in"] == 50
    assert out["cached_fraction"] == pytest.approx(7 / 8)
    assert out["steady_cycles_per_step"] == 1.0
    assert out["rank0_peak_mib"] == pytest.approx(round((4000 + 2 ** 20) / 2 ** 20, 1))
    assert out["rank0_liveness_sockets"] == 3


def test_the_steady_costs_are_the_typical_cycle_and_step_not_an_outlier():
    # Three steps of two cycles; one cycle took 20x the others.
    cpu = [1e-4, 1e-4, 1e-4, 2e-3, 1e-4, 1e-4]
    rows = [[0, 0.01, 0, 2, 1, 24, 1, 1000, 1, 500]]
    rows += [[1 + i // 2, c, 2, 0, 1, 24, 0, 0, 0, 0] for i, c in enumerate(cpu)]
    report = {"cycles": rows, "agreed": True, "exact": True, "error": "",
              "rank0_table_peak_bytes": 0, "rank0_liveness_sockets": 0}
    out = model.summarize(report, 8, 2, LINK)
    assert out["steady_cycle_rank0_cpu_us"] == pytest.approx(100.0)
    assert out["steady_step_rank0_cpu_us"] == pytest.approx(200.0)

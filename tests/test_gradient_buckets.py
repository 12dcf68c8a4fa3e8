"""Gradient buckets (Note [gradient buckets] in hvdkeras/engine/buckets.py),
the knobs that choose them, the MPI transport defaults (Note [eager ring
segments]) and the step picture's rows: pure logic, no MPI."""

from __future__ import annotations

import json

import pytest

from hvdkeras.engine import buckets, config
from hvdkeras.report.step_picture import draw_step, step_reductions


def test_buckets_follow_the_backward_order_and_close_at_the_limit():
    assert buckets.buckets([4, 4, 4, 4, 4], ["float32"] * 5, limit=8) == [[4, 3], [2, 1], [0]]
    assert buckets.buckets([100], ["float32"], limit=8) == [[0]]
    assert buckets.buckets([], [], limit=8) == []


def test_the_first_bucket_closes_early():
    sizes = [4, 4, 4, 4, 4]
    assert buckets.buckets(sizes, ["float32"] * 5, limit=12, first_limit=4) == [[4], [3, 2, 1], [0]]
    # A first variable bigger than first_limit fills the first bucket alone.
    assert buckets.buckets([8, 8, 64], ["f"] * 3, limit=16, first_limit=1) == [[2], [1, 0]]


def test_buckets_hold_one_dtype_each():
    dtypes = ["float32", "float16", "float32", "float16"]
    assert buckets.buckets([2, 2, 2, 2], dtypes, limit=4) == [[3, 1], [2, 0]]
    assert buckets.buckets([2, 2, 2, 2], dtypes, limit=100) == [[3, 1], [2, 0]]
    assert buckets.buckets([2, 2, 2, 2], dtypes, limit=100, first_limit=1) == [[3], [2], [1], [0]]


def test_every_position_is_in_exactly_one_bucket():
    sizes = [3, 50, 7, 7, 1, 90, 2]
    dtypes = ["float32", "bfloat16"] * 3 + ["float32"]
    for first in (None, 1, 5):
        found = sorted(p for b in buckets.buckets(sizes, dtypes, 10, first) for p in b)
        assert found == list(range(len(sizes)))


def test_sizes_and_dtypes_must_pair():
    with pytest.raises(ValueError, match="3 sizes but 2 dtypes"):
        buckets.buckets([1, 2, 3], ["f", "f"])


@pytest.mark.parametrize("env, local_size, size, wanted", [
    ({}, 1, 2, True), ({}, 2, 4, True), ({}, 4, 4, False), ({}, 1, 1, False),
    ({"HVDKERAS_BACKWARD_OVERLAP": "0"}, 1, 2, False),
    ({"HVDKERAS_BACKWARD_OVERLAP": "1"}, 4, 4, True),
    ({"HVDKERAS_BACKWARD_OVERLAP": "auto"}, 2, 4, True),
])
def test_when_buckets_are_wanted(env, local_size, size, wanted):
    assert buckets.overlap_wanted(local_size, size, env) is wanted


@pytest.mark.parametrize("env, local_size, size, wanted", [
    ({}, 4, 4, True), ({}, 1, 1, False), ({"HVDKERAS_BACKWARD_OVERLAP": "0"}, 4, 4, False),
])
def test_gradients_on_gpus_overlap_on_one_host_too(env, local_size, size, wanted):
    assert buckets.overlap_wanted(local_size, size, env, on_gpus=True) is wanted


def test_the_knobs_are_checked():
    with pytest.raises(ValueError, match="HVDKERAS_BACKWARD_OVERLAP"):
        config.backward_overlap({"HVDKERAS_BACKWARD_OVERLAP": "sometimes"})
    assert buckets.bucket_limit({}) == buckets.BUCKET_BYTES
    assert buckets.bucket_limit({"HVDKERAS_BUCKET_BYTES": "4096"}) == 4096
    for bad in ("0", "-1", "4MB"):
        with pytest.raises(ValueError, match="HVDKERAS_BUCKET_BYTES"):
            buckets.bucket_limit({"HVDKERAS_BUCKET_BYTES": bad})


def test_transport_defaults_fill_only_what_is_unset():
    assert config.transport_defaults({}) == config.MPI_TRANSPORT_DEFAULTS
    assert config.transport_defaults({"UCX_RNDV_THRESH": "inf"}) == {}
    assert config.transport_defaults({"UCX_RNDV_THRESH": " "}) == config.MPI_TRANSPORT_DEFAULTS


def _trace(steps):
    """A timeline with two buckets; each step: (submit, agreed, start, end) per bucket, in ms."""
    events = [{"ph": "M", "name": "process_name", "pid": p, "args": {"name": f"f/sgd_gradients_bucket_{p}"}}
              for p in (0, 1)]
    events.append({"ph": "M", "name": "process_name", "pid": 9, "args": {"name": "other"}})
    for step in steps:
        for pid, (submitted, agreed, start, end) in enumerate(step):
            events += [{"ph": "B", "pid": pid, "ts": submitted * 1000, "name": "NEGOTIATE_ALLREDUCE"},
                       {"ph": "E", "pid": pid, "ts": agreed * 1000},
                       {"ph": "B", "pid": pid, "ts": start * 1000, "name": "ALLREDUCE"},
                       {"ph": "B", "pid": pid, "ts": start * 1000 + 1, "name": "RING_ALLREDUCE"},
                       {"ph": "E", "pid": pid, "ts": end * 1000 - 1},
                       {"ph": "E", "pid": pid, "ts": end * 1000}]
        events += [{"ph": "B", "pid": 9, "ts": 0, "name": "ALLREDUCE"}, {"ph": "E", "pid": 9, "ts": 1}]
    return events


def test_step_rows_are_relative_to_the_first_submission():
    events = _trace([[(100, 101, 101, 150), (120, 150, 151, 200)],
                     [(1000, 1002, 1003, 1050), (1030, 1050, 1051, 1090)]])
    rows = step_reductions(events, step=1)
    assert [r["name"][-8:] for r in rows] == ["bucket_0", "bucket_1"]
    assert rows[0] == {"name": "f/sgd_gradients_bucket_0", "submitted": 0.0, "agreed": 2.0,
                       "start": 3.0, "end": 50.0}
    assert rows[1]["submitted"] == 30.0 and rows[1]["end"] == 90.0
    assert step_reductions(events, step=-2) == step_reductions(events, step=0)
    assert step_reductions([], step=0) == []


def test_cross_step_rows_carry_when_the_next_forward_pass_waited():
    events = _trace([[(100, 101, 101, 150), (120, 150, 151, 200)],
                     [(1000, 1002, 1003, 1050), (1030, 1050, 1051, 1090)]])
    for pid in (0, 1):
        events[pid]["args"]["name"] = f"f/sgd_gradients_pending_{pid}"
    # Step 0's waits (in step 1's forward pass), then step 1's.
    for ts, dur, pid in ((300, 5, 1), (310, 1, 0), (1100, 40, 1), (1150, 2, 0)):
        events.append({"ph": "X", "pid": pid, "tid": 3, "ts": ts * 1000, "dur": dur * 1000,
                       "name": "FRAMEWORK_WAIT"})
    rows = step_reductions(events, step=1)
    assert [r["name"][-9:] for r in rows] == ["pending_0", "pending_1"]
    assert (rows[0]["reached"], rows[0]["received"]) == (150.0, 152.0)
    assert (rows[1]["reached"], rows[1]["received"]) == (100.0, 140.0)
    assert "reached" not in step_reductions(_trace([[(1, 2, 3, 4)] * 2]), step=0)[0]


def test_the_step_picture_is_drawn(tmp_path):
    pytest.importorskip("matplotlib", reason="the report extra is not installed")
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(_trace([[(100, 101, 101, 150), (120, 150, 151, 200)]] * 3)))
    rows = draw_step(str(path), str(tmp_path / "step.png"), "two buckets")
    assert len(rows) == 2 and (tmp_path / "step.png").stat().st_size > 1000
    (tmp_path / "empty.json").write_text("[]")
    with pytest.raises(ValueError, match="no complete step"):
        draw_step(str(tmp_path / "empty.json"), str(tmp_path / "x.png"), "none")

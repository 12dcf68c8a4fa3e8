"""Pure logic of the torch optimizer's reductions during the backward pass
(hvdkeras/backends/torch/backward_overlap.py): which settings use it and
how gradients are put in buckets. No MPI."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the torch extra is not installed: pip install -e '.[torch]'")

from hvdkeras.backends.torch.backward_overlap import buckets, eligible  # noqa: E402
from hvdkeras.engine import config  # noqa: E402
from hvdkeras.engine.types import Adasum, Average, Sum  # noqa: E402


class _Named:
    def __init__(self, name: str):
        self.name = name


PLAIN = {"op": Average, "passes": 1, "groups": None, "num_groups": 0, "compression": None}


def test_buckets_follow_the_backward_order_and_close_at_the_limit():
    assert buckets([4, 4, 4, 4, 4], ["float32"] * 5, limit=8) == [[4, 3], [2, 1], [0]]
    assert buckets([100], ["float32"], limit=8) == [[0]]
    assert buckets([], [], limit=8) == []


def test_buckets_hold_one_dtype_each():
    dtypes = ["float32", "float16", "float32", "float16"]
    assert buckets([2, 2, 2, 2], dtypes, limit=4) == [[3, 1], [2, 0]]
    assert buckets([2, 2, 2, 2], dtypes, limit=100) == [[3, 1], [2, 0]]


def test_every_position_is_in_exactly_one_bucket():
    sizes = [3, 50, 7, 7, 1, 90, 2]
    dtypes = ["float32", "bfloat16"] * 3 + ["float32"]
    found = sorted(p for bucket in buckets(sizes, dtypes, limit=10) for p in bucket)
    assert found == list(range(len(sizes)))


@pytest.mark.parametrize("change, expected", [
    ({}, True), ({"op": Sum}, True), ({"num_groups": 1}, True),
    ({"compression": _Named("none")}, True),
    ({"op": Adasum}, False), ({"passes": 2}, False), ({"num_groups": 3}, False),
    ({"groups": [[1]]}, False), ({"compression": _Named("fp16")}, False),
])
def test_which_settings_reduce_during_backward(change, expected):
    assert eligible({**PLAIN, **change}, enabled=True) is expected
    assert eligible({**PLAIN, **change}, enabled=False) is False


def test_the_knob_defaults_to_auto_and_takes_booleans():
    assert config.torch_backward_overlap({}) == "auto"
    assert config.torch_backward_overlap({"HVDKERAS_TORCH_BACKWARD_OVERLAP": " Auto"}) == "auto"
    assert config.torch_backward_overlap({"HVDKERAS_TORCH_BACKWARD_OVERLAP": "0"}) == "off"
    assert config.torch_backward_overlap({"HVDKERAS_TORCH_BACKWARD_OVERLAP": "yes"}) == "on"
    with pytest.raises(ValueError, match="HVDKERAS_TORCH_BACKWARD_OVERLAP"):
        config.torch_backward_overlap({"HVDKERAS_TORCH_BACKWARD_OVERLAP": "maybe"})

"""Pure logic of the torch optimizer's reductions during the backward pass
(hvdkeras/backends/torch/backward_overlap.py): which settings use it and
how its knob reads (the buckets themselves: tests/test_gradient_buckets.py). No MPI."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the torch extra is not installed: pip install -e '.[torch]'")

from hvdkeras.backends.torch.backward_overlap import eligible  # noqa: E402
from hvdkeras.engine import config  # noqa: E402
from hvdkeras.engine.types import Adasum, Average, Sum  # noqa: E402


class _Named:
    def __init__(self, name: str):
        self.name = name


PLAIN = {"op": Average, "passes": 1, "groups": None, "num_groups": 0, "compression": None}


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


def test_the_torch_knob_overrides_the_general_one():
    both = {"HVDKERAS_TORCH_BACKWARD_OVERLAP": "0", "HVDKERAS_BACKWARD_OVERLAP": "1"}
    assert config.torch_backward_overlap(both) == "off"
    assert config.torch_backward_overlap({"HVDKERAS_BACKWARD_OVERLAP": "1"}) == "on"

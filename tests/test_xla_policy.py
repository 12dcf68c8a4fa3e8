"""Where a train step may be XLA-compiled with hvdkeras collectives (pure policy,
hvdkeras.collectives.xla_calls.refusal_reason) and the opt-in for GPUs."""

from __future__ import annotations

import pytest

from hvdkeras.collectives import xla_calls


def test_cpu_steps_compile_when_the_targets_exist():
    assert xla_calls.refusal_reason(True, False, on_gpu=False, opted_in=False) == ""


def test_no_targets_no_xla_anywhere():
    for on_gpu in (False, True):
        why = xla_calls.refusal_reason(False, False, on_gpu, opted_in=True)
        assert "without XLA's custom-call headers" in why


def test_gpu_needs_the_gpu_targets():
    why = xla_calls.refusal_reason(True, False, on_gpu=True, opted_in=True)
    assert "no GPU part" in why


def test_gpu_targets_are_opt_in():
    why = xla_calls.refusal_reason(True, True, on_gpu=True, opted_in=False)
    assert xla_calls.XLA_GPU + "=1" in why
    assert xla_calls.refusal_reason(True, True, on_gpu=True, opted_in=True) == ""


@pytest.mark.parametrize("raw, expected", [("", False), ("1", True), ("0", False), ("yes", True)])
def test_opt_in_variable(raw, expected):
    assert xla_calls.gpu_opted_in({xla_calls.XLA_GPU: raw}) is expected


def test_opt_in_variable_rejects_nonsense():
    with pytest.raises(ValueError, match=xla_calls.XLA_GPU):
        xla_calls.gpu_opted_in({xla_calls.XLA_GPU: "maybe"})


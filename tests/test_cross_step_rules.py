"""The cross-step decision (hvdkeras/training/cross_step_rules.py) and its
knob, as plain functions: no MPI, no TensorFlow."""

import dataclasses

import pytest

from hvdkeras.engine import config
from hvdkeras.training import cross_step_rules as rules

ELIGIBLE = rules.StepFacts(mode="on", optimizer_class="Adam")


def test_the_knob_reads_auto_on_and_off():
    assert config.cross_step_overlap({}) == "auto"
    assert config.cross_step_overlap({config.CROSS_STEP_OVERLAP: "1"}) == "on"
    assert config.cross_step_overlap({config.CROSS_STEP_OVERLAP: "0"}) == "off"
    with pytest.raises(ValueError, match="HVDKERAS_CROSS_STEP_OVERLAP"):
        config.cross_step_overlap({config.CROSS_STEP_OVERLAP: "sometimes"})


def test_auto_asks_for_it_across_hosts_only():
    assert rules.wanted("auto", local_size=1, size=2)
    assert rules.wanted("auto", local_size=4, size=16)
    assert not rules.wanted("auto", local_size=2, size=2)
    assert not rules.wanted("auto", local_size=1, size=1)
    assert rules.wanted("on", local_size=2, size=2)
    assert not rules.wanted("off", local_size=1, size=2)


@pytest.mark.parametrize("name", rules.PER_VARIABLE_OPTIMIZERS)
def test_per_variable_optimizers_are_eligible(name):
    assert rules.refusal(dataclasses.replace(ELIGIBLE, optimizer_class=name)) is None


@pytest.mark.parametrize("change, words", [
    ({"optimizer_class": "Nadam"}, "Nadam is not one of"),
    ({"optimizer_class": ""}, "a subclass of a Keras optimizer"),
    ({"loss_scaled": True}, "LossScaleOptimizer"),
    ({"global_clipnorm": True}, "global_clipnorm"),
    ({"ema": True}, "use_ema"),
    ({"accumulation": True}, "accumulation"),
    ({"zero_stage": 3}, "zero_stage=3"),
    ({"reduce_op": "Adasum"}, "op=Adasum"),
    ({"explicit_groups": True}, "num_groups or groups"),
    ({"on_gpus": True}, "GPUs"),
    ({"built_eagerly": False}, "optimizer.build"),
])
def test_each_refusal_names_its_reason(change, words):
    reason = rules.refusal(dataclasses.replace(ELIGIBLE, **change))
    assert reason is not None and words in reason


def test_loss_scaling_is_named_before_the_class():
    """A LossScaleOptimizer's class is not a per-variable one; the reason a
    user can act on is the loss scaling."""
    facts = dataclasses.replace(ELIGIBLE, optimizer_class="", loss_scaled=True)
    assert "LossScaleOptimizer" in rules.refusal(facts)

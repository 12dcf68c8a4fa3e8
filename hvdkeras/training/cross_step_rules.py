"""When a step's updates may wait for the next step's reads (Note
[cross-step updates] in `cross_step`): the decision as a plain function of
facts, tested without MPI or TensorFlow.

What may import this module: anything; it imports nothing of hvdkeras.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

# Keras's optimizers whose update of a variable reads only that variable, its
# gradient, its own slots and shared scalars (the learning rate, the
# iteration count), and that change no shared state once per step: each
# variable may then be updated on its own, at a time of its own. Nadam is
# left out (`_backend_update_step` advances a product shared by every
# variable once per call), as are subclasses (which may change either).
PER_VARIABLE_OPTIMIZERS = ("Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "Ftrl", "Lion",
                           "RMSprop", "SGD")


@dataclasses.dataclass(frozen=True)
class StepFacts:
    """What the decision needs to know about a distributed optimizer.

    Attributes:
        mode: `HVDKERAS_CROSS_STEP_OVERLAP`: "auto", "on" or "off".
        optimizer_class: The Keras class the user's optimizer is an instance
            of (its name), or "" when it is a subclass of one.
        loss_scaled: A `LossScaleOptimizer` wraps it (mixed_float16).
        global_clipnorm: `global_clipnorm` is set.
        ema: `use_ema` is on.
        accumulation: `backward_passes_per_step` > 1 or Keras's
            `gradient_accumulation_steps`.
        zero_stage: The ZeRO stage (0: none).
        reduce_op: "Average", "Sum" or "Adasum".
        explicit_groups: `num_groups` or `groups` was given.
        on_gpus: The step runs on GPUs.
        built_eagerly: The optimizer was built outside any traced function.
    """

    mode: str
    optimizer_class: str
    loss_scaled: bool = False
    global_clipnorm: bool = False
    ema: bool = False
    accumulation: bool = False
    zero_stage: int = 0
    reduce_op: str = "Average"
    explicit_groups: bool = False
    on_gpus: bool = False
    built_eagerly: bool = True


def wanted(mode: str, local_size: int, size: int) -> bool:
    """Whether cross-step updates are asked for: "on" and "off" decide;
    "auto" (the default) asks for them when the ranks span several hosts,
    where the link is the limit and the next forward pass can run while it
    carries the last buckets (docs/performance.md, "Across hosts: the next
    step"). On one host the reductions are memory work on the cores the
    forward pass needs, so "auto" keeps the synchronous step there. The
    answer is the same on every rank, as the requests' names depend on it.

    Example:
        >>> wanted("auto", local_size=1, size=2), wanted("auto", local_size=2, size=2)
        (True, False)
    """
    if mode == "auto":
        return local_size < size
    return mode == "on"


def refusal(facts: StepFacts) -> Optional[str]:
    """Why this optimizer keeps the synchronous step although cross-step
    updates are wanted, or None when they apply.

    Example:
        >>> refusal(StepFacts(mode="on", optimizer_class="Adam")) is None
        True
        >>> refusal(StepFacts(mode="on", optimizer_class="Adam", ema=True))
        'use_ema averages every weight after each step'
    """
    if facts.loss_scaled:
        return ("a LossScaleOptimizer (mixed_float16) checks every gradient for overflow "
                "before any update")
    if facts.global_clipnorm:
        return "global_clipnorm needs the norm of every gradient before any update"
    if facts.ema:
        return "use_ema averages every weight after each step"
    if facts.accumulation:
        return "gradient accumulation applies updates only at the end of a window"
    if facts.zero_stage:
        return f"zero_stage={facts.zero_stage} shards the update"
    if facts.reduce_op not in ("Average", "Sum"):
        return f"op={facts.reduce_op} combines all gradients as a whole"
    if facts.explicit_groups:
        return "num_groups or groups choose the collectives; cross-step updates use buckets"
    if facts.on_gpus:
        return "the step runs on GPUs (pending reductions hold CPU tensors only)"
    if facts.optimizer_class not in PER_VARIABLE_OPTIMIZERS:
        name = facts.optimizer_class or "a subclass of a Keras optimizer"
        return (f"{name} is not one of the optimizers known to update each variable on its "
                f"own ({', '.join(PER_VARIABLE_OPTIMIZERS)})")
    if not facts.built_eagerly:
        return ("the optimizer was built inside the first traced step, after its forward "
                "pass had read the weights: pass an hvdkeras callback to fit() (it builds the "
                "optimizer first) or call model.optimizer.build(model.trainable_variables) "
                "before fit()")
    return None

"""What a checkpoint carries besides the model for an exact resume: its
position and the state of every layer's random generator.

Note [exact resume]
~~~~~~~~~~~~~~~~~~~
A run killed at any checkpoint and resumed takes the same steps as an
uninterrupted run when, at that checkpoint, everything that decides the next
step is restored:
* the weights and the optimizer state (slots, iteration count): the `.keras`
  file itself;
* the layers' random generators (Dropout masks, noise, augmentation), which
  `model.save()` leaves out: `resume_state` below, in the archive's
  `RESUME_ENTRY`, put back on the root by `apply_random_states` and sent to
  every rank by `broadcast_model` (their variables are in `model.variables`);
* the position in the data: the recipes' training stream is one seeded,
  repeated sequence of batches that Keras reads with a single iterator across
  epochs (steps_per_epoch set), so the resumed run skips the batches already
  taken (`hvdkeras/recipes/training.py`);
* the step within the epoch: a mid-epoch checkpoint (`every_steps`) resumes
  with a fit of the epoch's remaining steps, callbacks offset by
  `batch_offset` (CheckpointCallback, StopAtStep).
Unseeded `keras.random` calls in custom code use Keras' global generator,
which is not in the checkpoint. `tests/test_exact_resume.py` checks the whole.

What may import this module: the rest of `hvdkeras.training` and the callbacks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hvdkeras import compat


def resume_state(model: Any, epochs: int, step: int, world_size: int = 0,
                 steps_per_epoch: int = 0) -> dict:
    """The checkpoint's position and random states, as plain JSON values.

    Args:
        model: The model being saved.
        epochs: Finished epochs at the checkpoint.
        step: Steps of the next epoch already taken.
        world_size: Ranks of the run that saved it (an elastic restart may
            resume on another number).
        steps_per_epoch: That run's steps per epoch (0: unknown).
    """
    return {"epochs": epochs, "step": step, "world_size": world_size,
            "steps_per_epoch": steps_per_epoch,
            "random_states": [[int(x) for x in v.numpy().ravel()]
                              for v in compat.layer_random_states(model)]}


def apply_random_states(model: Any, state: dict) -> bool:
    """Puts the saved random-generator states back into `model`'s layers.

    Returns False (and changes nothing) when the saved states do not match
    the model's generators in number and shape (a different architecture).
    """
    variables = compat.layer_random_states(model)
    saved = state.get("random_states") or []
    if len(saved) != len(variables) or any(
            len(values) != int(v.numpy().size) for values, v in zip(saved, variables)):
        return False
    for values, variable in zip(saved, variables):
        variable.assign(np.asarray(values, dtype=variable.dtype).reshape(variable.shape))
    return True

"""Training with Keras 3 on several ranks: everything between a gradient and
an update, and the state around it.

* `optimizer` (`DistributedOptimizer`) and `gradient_tape`
  (`DistributedGradientTape`) reduce gradients through `gradient_reduction`
  (groups, scale factors, sparse gradients), with `compression` on the wire
  and `local_accumulation` for `backward_passes_per_step`; `guards` turns
  misuse that would hang into errors (see Note [distributed wrapper outside
  loss scaling]).
* `schedules` (`scale_lr`, `WarmupSchedule`), `lr_formulas` (the
  learning-rate arithmetic, pure) and `lr_variable` (the optimizer's
  learning-rate variable, for callbacks).
* `model_sync` (broadcasting model and optimizer state), the checkpoint files
  (`checkpoint_naming`, `checkpoint_writing`, `checkpoint_restore`) and
  `output` (rank 0 speaks).

What may import it: `hvdkeras.callbacks`, the recipes' training code and the
top-level package. It imports `hvdkeras.collectives`, `hvdkeras.engine` and
`hvdkeras.compat`. Importing this package imports none of its modules.
"""

"""Keras backends other than TensorFlow, each behind the engine's C entry
points (Note [one engine, many bindings] in `hvdkeras/engine/toolchain.py`).

Each framework is one folder (`torch/`, `jax/`): its tensors, its custom ops
and autograd. Beside them: `optimizer` (their `DistributedOptimizer`),
`variables` (broadcasting Keras variables through `hvdkeras.host`) and
`dispatch`, which says which public names a backend defines itself.

What may import this package: the facade (`hvdkeras/__init__.py`), the
callbacks, `hvdkeras.training` and the recipes; it imports `hvdkeras.engine`,
`hvdkeras.host` and `hvdkeras.sharding`.
"""

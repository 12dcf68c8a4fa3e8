"""Keras backends other than TensorFlow, each behind the engine's C entry
points (Note [one engine, many bindings] in `hvdkeras/engine/toolchain.py`).

`host` runs collectives on host buffers given by address, shape and element
type name; `arrays` offers them on NumPy arrays (used by what every backend
shares: callbacks, metric averaging, broadcasting Keras variables in
`variables`). Each framework is one folder (`torch/`): its tensors, its
custom ops and autograd, its `DistributedOptimizer`. `dispatch` says which
public names a backend defines itself.

What may import this package: the facade (`hvdkeras/__init__.py`), the
callbacks and the recipes; it imports `hvdkeras.engine` only.
"""

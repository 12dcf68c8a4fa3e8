"""Collectives on host memory that need no deep-learning framework: buffers
given by address, shape and element type (`buffers`), NumPy arrays
(`arrays`), picklable Python objects (`objects`) and `join`
(`synchronization`).

They run one synchronous engine request each, so they serve every Keras
backend alike: the torch and JAX bindings hand over their tensors' memory
here, and what runs eagerly under any backend (callbacks, checkpoints,
metric averaging, moving sharded optimizer state) uses them without
importing TensorFlow.

What may import this package: everything above `hvdkeras.engine`; it
imports `hvdkeras.engine` only.
"""

"""The JAX backend: hvdkeras's collectives as an XLA FFI custom call usable
inside `jax.jit` (`ops`, with gradients through `jax.custom_vjp`), and their
public functions (`collectives`). Keras's JAX trainer jits the whole train
step, optimizer included, so the gradients are reduced inside it.

Arrays live in host memory (the CPU platform) or on an NVIDIA GPU (the
CUDA platform, through the engine's NCCL path); the binding itself is
`ops/jax/ffi_collectives.cc`, compiled beside the engine on first use.

What may import this package: the facade's dispatch and `hvdkeras.backends`.
"""

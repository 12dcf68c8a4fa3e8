"""Which Keras backend this process trains with, and the framework-specific
parts of starting a rank (thread pools, GPU visibility) for each.

The backend is Keras's own answer (`keras.backend.backend()`): the
`KERAS_BACKEND` variable or `keras.json`, as the user's script sees it.

What may import this module: the rest of `hvdkeras.engine` and everything above it.
"""

from __future__ import annotations

import sys
from typing import Any

TENSORFLOW = "tensorflow"
JAX = "jax"
TORCH = "torch"
SUPPORTED = (TENSORFLOW, JAX, TORCH)


def keras_backend() -> str:
    """The Keras backend of this process ("tensorflow", "jax", "torch", ...)."""
    import keras  # lazy: importing Keras imports its backend framework

    return keras.backend.backend()


def check_supported(backend: str) -> None:
    """Raises a clear error for a Keras backend hvdkeras cannot train with yet."""
    if backend not in SUPPORTED:
        raise RuntimeError(
            f"hvdkeras does not support the Keras backend {backend!r} yet; supported: "
            f"{', '.join(SUPPORTED)}. Set KERAS_BACKEND to one of them.")


def set_thread_pools(backend: str, threads: int, warn: bool, spin: bool) -> None:
    """Sizes the framework's CPU thread pools for a rank that shares its cores."""
    if backend == TORCH:
        import torch  # lazy: only under the PyTorch backend

        torch.set_num_threads(threads)
        return
    if backend == JAX:
        return  # XLA's CPU client sizes its pool when it starts; it takes no later setting
    from hvdkeras.engine import tf_threads  # lazy: keeps this module import-light

    tf_threads.apply(threads, warn, spin=spin)


def use_gpu(backend: str, index: int) -> Any:
    """Makes the torch or jax framework of this process use visible GPU `index`
    (TensorFlow's pinning is `hvdkeras.gpu.pin`'s own). Returns the device,
    or None when the framework has no GPU support installed."""
    if backend == TORCH:
        import torch  # lazy: only under the PyTorch backend

        if not torch.cuda.is_available():
            return None
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    if backend == JAX:
        import jax  # lazy: only under the JAX backend

        # Must come before JAX starts its GPU client (before any array exists).
        jax.config.update("jax_cuda_visible_devices", str(index))
        try:
            return jax.devices("gpu")[0]
        except RuntimeError:  # a CPU-only jaxlib
            return None
    raise ValueError(f"use_gpu is for the torch and jax backends, not {backend!r}")


def sees_gpu(backend: str) -> bool:
    """Whether the backend's framework, if already imported, sees a GPU."""
    if backend == TORCH and "torch" in sys.modules:
        return bool(sys.modules["torch"].cuda.is_available())
    if backend == TENSORFLOW and "tensorflow" in sys.modules:
        return bool(sys.modules["tensorflow"].config.list_physical_devices("GPU"))
    return False

"""`pin_gpu()`: one GPU per process, chosen by local rank, memory growth on.

What may import this module: the top-level package, the recipes and the
callbacks (which ask which GPU was pinned).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Optional

from hvdkeras.engine import c_api, frameworks, library, world
from hvdkeras.gpu import nvml
from hvdkeras.gpu.pinning import PinningError, choose_gpu, parse_visible_devices

_pinned_entry: Optional[str] = None


def pin_gpu() -> Any:
    """Makes this process use only its local rank's GPU, with memory growth on.

    Call it on every rank after `hvdkeras.init()` and before the framework
    runs anything (it must come before TensorFlow or JAX sets up its GPUs).
    Under torch and jax the GPUs are counted through NVML, without
    importing TensorFlow. An existing
    `CUDA_VISIBLE_DEVICES` is honoured: the process picks among the GPUs it
    shows; where a scheduler gave each process of a host different GPUs,
    each keeps the first of its own. On a machine without GPUs it does
    nothing, so one script serves both.

    Returns:
        The device in use: a `tf.config.PhysicalDevice` under TensorFlow,
        a `torch.device` under torch, a JAX device under jax (the latter two
        only where the framework's GPU build is installed); None without GPUs.

    Raises:
        PinningError: on every rank, when some host has fewer GPUs than
            processes (the message names the host's figures).
        RuntimeError: when TensorFlow has already set up its GPUs.

    Example:

    ```python
    import hvdkeras as hvd
    hvd.init()
    hvd.pin_gpu()
    model = build_model()  # on this rank's GPU
    ```
    """
    global _pinned_entry
    w = world.require()
    backend = frameworks.keras_backend()
    setting = os.environ.get("CUDA_VISIBLE_DEVICES")
    if backend == frameworks.TENSORFLOW:
        import tensorflow as tf  # lazy: `import hvdkeras` stays light

        gpus = tf.config.list_physical_devices("GPU")  # sets up no GPU yet
        count = len(gpus)
    else:  # counted without starting the framework's GPU support (or TensorFlow)
        count = len(parse_visible_devices(setting, nvml.device_count()))
    # Every rank must be here before the host-wide gathers below (bounded).
    world.meet("hvdkeras.pin_gpu()")
    host = w.local_comm.allgather((setting, count))
    settings = [s for s, _ in host]
    problem = None
    if any(count for _, count in host):
        for local_rank, (_, count) in enumerate(host):
            try:
                choose_gpu(local_rank, w.local_size, count, settings)
            except PinningError as error:
                problem = problem or f"local rank {local_rank}: {error}"
    # Every rank learns of any host's problem, so all fail together: local
    # rank 0 of each host hears from every host, then tells its neighbours.
    by_host = w.cross_comm.allgather(problem)
    problems = [p for group in w.local_comm.allgather(by_host) for p in group if p]
    if problems:
        raise PinningError("hvdkeras.pin_gpu(): " + problems[0])
    if not count:
        return None
    index = choose_gpu(w.local_rank, w.local_size, count, settings)
    if backend == frameworks.TENSORFLOW:
        device = gpus[index]
        try:
            tf.config.set_visible_devices(device, "GPU")
            tf.config.experimental.set_memory_growth(device, True)
        except RuntimeError as error:
            raise RuntimeError(
                "hvdkeras.pin_gpu() must run before TensorFlow sets up its GPUs (before any "
                f"tensor, model or op is made): {error}") from error
    else:
        device = frameworks.use_gpu(backend, index)
    # The engine learns the GPU (a rank whose batch holds only a joined
    # rank's stand-ins uses it) and readies it now, kernels included, so the
    # first collective does not compile them.
    unusable = c_api.gpu_pin(library.engine_handle(), index)
    if unusable:
        warnings.warn(f"hvdkeras.pin_gpu(): the GPU collectives cannot use GPU {index}: "
                      f"{unusable}", RuntimeWarning, stacklevel=2)
    physical = nvml.device_count() or count
    visible = parse_visible_devices(setting, physical)
    _pinned_entry = visible[index] if index < len(visible) else None
    return device


def pinned_device_entry() -> Optional[str]:
    """The `CUDA_VISIBLE_DEVICES` entry (ordinal or UUID) of the GPU in use.

    The one `pin_gpu()` chose, else the first visible GPU (TensorFlow's
    default); None without GPUs.
    """
    if _pinned_entry is not None:
        return _pinned_entry
    visible = parse_visible_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), nvml.device_count())
    return visible[0] if visible else None

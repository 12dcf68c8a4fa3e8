"""The Python side of the C++ engine: building and loading the op library,
its C entry points, the engine's settings, and this process's world.

* `toolchain` / `build`: what the op library is built from; compiling it once
  per TensorFlow/MPI/compiler/source combination into a cache.
* `library`: loading it (TensorFlow kernels and ctypes handle, one copy).
* `c_api`: the typed C entry points; settings cross as "name=value" text.
* `config`: the engine's settings read from `HVDKERAS_*` variables (pure).
* `types`: the reductions and element types (see Note [wire vocabulary]).
* `world`: `init()`/`shutdown()` and rank, size, local and cross ranks.
* `tf_threads`: how ranks sharing a host share TensorFlow's thread pools.

What may import it: everything above it (collectives, training, callbacks,
recipes, the CLI); `config` and `types` also from the launcher (`runner`),
which must not import TensorFlow. It imports nothing of hvdkeras but
`hvdkeras.compat`. Importing this package imports none of its modules.
"""

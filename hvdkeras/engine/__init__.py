"""The Python side of the C++ engine: building and loading the op library,
its C entry points, the engine's settings, and this process's world.

* `toolchain` / `build`: what the engine and op libraries are built from;
  compiling them once per TensorFlow/MPI/compiler/source combination into a
  cache (Note [one engine, many bindings]); `binding_build`: the other
  backends' compiled bindings (JAX's FFI handler) beside them.
* `library`: loading them (TensorFlow kernels and ctypes handle, or the
  engine library alone for the other backends; one engine either way).
* `c_api`: the typed C entry points; settings cross as "name=value" text.
* `requests`: synchronous collectives over host buffers (the C request API).
* `frameworks`: which Keras backend runs, and its thread pools and GPUs.
* `config`: the engine's settings read from `HVDKERAS_*` variables (pure).
* `types`: the reductions and element types (see Note [wire vocabulary]).
* `world`: `init()`/`shutdown()` and rank, size, local and cross ranks.
* `tf_threads`: how ranks sharing a host share TensorFlow's thread pools.

What may import it: everything above it (collectives, training, callbacks,
recipes, the CLI); `config` and `types` also from the launcher (`runner`),
which must not import TensorFlow. It imports nothing of hvdkeras but
`hvdkeras.compat`. Importing this package imports none of its modules.
"""

"""This process's place in the job: init/shutdown and the world's ranks and sizes.

What may import this module: anything above `hvdkeras.engine` (collectives,
training, callbacks, recipes, the CLI). It imports mpi4py and TensorFlow
only inside `init()`.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
from typing import Any, Optional

from hvdkeras.engine import agreement, c_api, failfast, library
from hvdkeras.engine import process_sets as process_set_registry
from hvdkeras.engine import frameworks, tf_threads
from hvdkeras.engine.config import (EXPECTED_SIZE, EngineConfig, engine_config_from_env,
                                    transport_defaults,
                                    ignored_horovod_aliases, info_logs)

# The MPI standard's thread levels; mpi4py.MPI.THREAD_* hold the same values.
_THREAD_LEVEL_NAMES = {0: "MPI_THREAD_SINGLE", 1: "MPI_THREAD_FUNNELED",
                       2: "MPI_THREAD_SERIALIZED", 3: "MPI_THREAD_MULTIPLE"}
_THREAD_MULTIPLE = 3


def thread_level_name(level: int) -> str:
    """Name of an MPI thread support level, e.g. 3 -> ``MPI_THREAD_MULTIPLE``."""
    return _THREAD_LEVEL_NAMES.get(level, f"unknown ({level})")


@dataclasses.dataclass
class _World:
    comm: Any  # the engine's private duplicate of the user's communicator
    control_comm: Any  # hvdkeras's own Python-side calls (process sets, meetings)
    local_comm: Any
    cross_comm: Any
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    homogeneous: bool
    thread_level: int
    config: EngineConfig


_world: Optional[_World] = None
_atexit_registered = False


def _not_initialized() -> ValueError:
    return ValueError(
        "hvdkeras has not been initialized (or has been shut down): call hvdkeras.init() first."
    )


def require() -> _World:
    """This process's world; raises ValueError when hvdkeras is not initialized."""
    if _world is None:
        raise _not_initialized()
    return _world


def _check_expected_size(actual: int) -> None:
    """Catches a launcher from one MPI starting ranks linked to another.

    `hvdkerasrun` sets HVDKERAS_EXPECTED_SIZE; an MPI library that does not
    understand the launcher starts every rank as its own world of size 1.
    """
    expected = os.environ.get(EXPECTED_SIZE, "").strip()
    if expected.isdigit() and int(expected) != actual:
        raise RuntimeError(
            f"This process was launched as one of {expected} ranks but MPI reports a world of "
            f"size {actual}: the mpiexec that started it belongs to a different MPI than the "
            "one mpi4py loads. Use the mpiexec of the MPI that mpi4py uses (hvdkerasrun picks "
            "it for you) or point mpi4py at the MPI whose mpiexec you use."
        )


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Starts hvdkeras on this process. Call it once, on every rank, first.

    Builds the op library if this TensorFlow/MPI combination has none yet,
    duplicates the communicator for the engine's private use, and starts the
    background engine. A second call while running does nothing. A script run
    without `mpiexec` is a world of size 1.

    Ranks that share a host's cores also share TensorFlow's thread pools out
    between them (see `HVDKERAS_TF_THREADS`), which only takes effect when
    `init()` runs before the first TensorFlow op.

    Args:
        comm: An `mpi4py.MPI.Intracomm` to run on (default `COMM_WORLD`). The
            engine works on a duplicate, so the caller may keep using it.
        process_sets: `ProcessSet`s to register now (Horovod's static process
            sets), or "dynamic" (accepted for Horovod scripts: sets can always
            be added later with `add_process_set`).

    Raises:
        ValueError: if an `HVDKERAS_*` knob has a bad value.
        RuntimeError: if MPI gives too low a thread level or the engine fails
            to start.

    Example:

    ```python
    import hvdkeras as hvd
    hvd.init()
    print(f"rank {hvd.rank()} of {hvd.size()}")
    ```
    """
    global _world, _atexit_registered
    if _world is not None:
        return
    process_set_registry.check_init_argument(process_sets)
    backend = frameworks.keras_backend()
    frameworks.check_supported(backend)
    config = engine_config_from_env()
    threads_setting = tf_threads.parse_setting()
    os.environ.update(transport_defaults(os.environ))  # Note [eager ring segments]
    from mpi4py import MPI  # lazy: importing it initializes MPI, which only init() may do

    if comm is None:
        comm = MPI.COMM_WORLD
        _check_expected_size(comm.Get_size())
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(
            f"hvdkeras.init(comm=...) needs an mpi4py.MPI.Intracomm, got {type(comm).__name__}."
        )
    abort_on_error = failfast.enabled(comm.Get_size())  # a bad value fails before MPI work
    thread_level = MPI.Query_thread()
    if thread_level < MPI.THREAD_SERIALIZED:
        raise RuntimeError(
            f"MPI was initialized with {thread_level_name(thread_level)}, "
            "but hvdkeras runs MPI on a background thread and needs at least "
            "MPI_THREAD_SERIALIZED (MPI_THREAD_MULTIPLE to use mpi4py alongside it). "
            "Do not lower mpi4py.rc.thread_level."
        )
    lib = library.engine_handle()
    # Every rank must be here before the collective calls below (Note
    # [bounded waits] in ops/core/watchdog.h); no engine runs yet to ask.
    agreement.meet(comm, "hvdkeras.init()", timeout_s=config.stall_shutdown_seconds,
                   say=lambda text: c_api.set_activity(lib, text))
    engine_comm = comm.Dup()
    control_comm = comm.Dup()  # process set bookkeeping, never used by the engine thread
    local_comm = engine_comm.Split_type(MPI.COMM_TYPE_SHARED, key=engine_comm.Get_rank())
    cross_comm = engine_comm.Split(color=local_comm.Get_rank(), key=engine_comm.Get_rank())
    local_sizes = engine_comm.allgather(local_comm.Get_size())
    _share_threads(backend, threads_setting, local_comm, warn=engine_comm.Get_rank() == 0)
    try:
        c_api.start(lib, engine_comm.py2f(), config)
    except RuntimeError:
        for c in (cross_comm, local_comm, engine_comm, control_comm):
            c.Free()
        raise
    _world = _World(
        comm=engine_comm, control_comm=control_comm, local_comm=local_comm, cross_comm=cross_comm,
        rank=engine_comm.Get_rank(), size=engine_comm.Get_size(),
        local_rank=local_comm.Get_rank(), local_size=local_comm.Get_size(),
        cross_rank=cross_comm.Get_rank(), cross_size=cross_comm.Get_size(),
        homogeneous=len(set(local_sizes)) == 1, thread_level=thread_level, config=config,
    )
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
    process_set_registry.open_registry(control_comm, _world.rank, _world.size,
                                       thread_level >= _THREAD_MULTIPLE,
                                       config, lib)
    if abort_on_error:
        # MPI_COMM_WORLD, not the engine's duplicate: every process of the job ends.
        failfast.install(MPI.COMM_WORLD.Abort, _world.rank, _world.size)
    process_set_registry.register_at_init(process_sets)
    _announce_gpu_part(lib, _world.rank == 0, backend)
    if _world.rank == 0:
        for line in ignored_horovod_aliases(os.environ):
            print(f"hvdkeras: {line}", file=sys.stderr, flush=True)


_gpu_announced = False


def _announce_gpu_part(lib: Any, is_rank0: bool, backend: str) -> None:
    """Says once (rank 0) when the library has a GPU part but no GPU is usable.

    Such a library works as a CPU build: GPU tensors never reach it, since
    TensorFlow then has no GPU to place them on. On a machine where
    TensorFlow sees no GPU either that is the normal CPU case, said only at
    info level (`--log-level info`; `hvdkeras check` always shows it); a
    warning only where TensorFlow sees a GPU that the collectives cannot use.
    """
    global _gpu_announced
    if _gpu_announced or not is_rank0 or c_api.build_flavor(lib) == "cpu":
        return
    _gpu_announced = True
    count, description = c_api.gpu_probe(lib)
    if count >= 0:
        return
    message = (f"the op library has its GPU part, but {description}; collectives run on "
               "the CPU")
    if frameworks.sees_gpu(backend):
        print(f"hvdkeras: warning: {backend} sees a GPU, but {message}", file=sys.stderr,
              flush=True)
    elif info_logs():
        print(f"hvdkeras: {message}", file=sys.stderr, flush=True)


def _share_threads(backend: str, setting: int, local_comm: Any, warn: bool) -> None:
    """Applies the HVDKERAS_TF_THREADS policy to the backend's thread pools;
    collective over the host's ranks."""
    if setting == tf_threads.OFF:
        return
    cpus = tf_threads.allowed_cpus()
    cpu_sets = local_comm.allgather(cpus)
    shared = tf_threads.sharing_ranks(cpus, cpu_sets) > 1
    if setting == tf_threads.AUTO and not shared:
        return  # no other rank competes for these cores: TensorFlow's defaults fit
    threads = setting if setting > 0 else tf_threads.threads_per_rank(cpus, cpu_sets)
    frameworks.set_thread_pools(backend, threads, warn, spin=not shared)


def shutdown() -> None:
    """Stops the engine on every rank. Ops still in flight fail.

    Any rank may call it; the others stop at their next negotiation cycle,
    and their later ops fail with a message saying hvdkeras was shut down.
    Registered to run at interpreter exit. Calling it when not initialized
    does nothing.

    Example:

    ```python
    hvd.shutdown()
    assert not hvd.is_initialized()
    ```
    """
    global _world
    if _world is None:
        return
    world, _world = _world, None
    failfast.uninstall()
    process_set_registry.close_registry()
    library.engine_handle().hvdkeras_engine_stop()
    for c in (world.cross_comm, world.local_comm, world.comm):
        c.Free()


def meet(what: str, value: Any = None) -> list:
    """Every rank's `value`, once all ranks called `meet` for `what`.

    Bounded by HVDKERAS_STALL_SHUTDOWN_SECONDS; raises on every rank that
    waited when some rank is elsewhere (see `hvdkeras.engine.agreement`).
    """
    w = require()
    return agreement.meet_with_engine(w.control_comm, library.engine_handle(),
                                      w.config.stall_shutdown_seconds, what, value)


def is_initialized() -> bool:
    """Whether `init()` has run and `shutdown()` has not."""
    return _world is not None


def engine_stopped() -> bool:
    """Whether `init()` has run and its engine has stopped since, without
    `shutdown()`: a collective failed on some rank (a GPU batch, a lost
    peer), and every later collective repeats that error."""
    return _world is not None and not library.engine_handle().hvdkeras_engine_running()


def size() -> int:
    """Number of processes (ranks) in the job."""
    return require().size


def rank() -> int:
    """This process's rank, 0 to `size() - 1`."""
    return require().rank


def local_size() -> int:
    """Number of ranks on this host."""
    return require().local_size


def local_rank() -> int:
    """This process's rank among the ranks on its host (use it to pick a GPU)."""
    return require().local_rank


def cross_size() -> int:
    """Number of hosts that have a rank with this process's local rank."""
    return require().cross_size


def cross_rank() -> int:
    """This process's index among the ranks sharing its local rank across hosts."""
    return require().cross_rank


def is_homogeneous() -> bool:
    """Whether every host runs the same number of ranks."""
    return require().homogeneous


def mpi_threads_supported() -> bool:
    """Whether MPI runs with MPI_THREAD_MULTIPLE (mpi4py may be used alongside)."""
    return require().thread_level >= _THREAD_MULTIPLE


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing a Chrome trace of the engine's work to `file_path`.

    Rank 0 writes the file (other ranks may call this too; it does nothing
    there). The trace shows, per tensor, its negotiation with the moment each
    rank was ready and the phases of its execution. It is valid JSON at any
    moment, so it can be opened while training runs or after a crash, in
    Perfetto (ui.perfetto.dev) or chrome://tracing.

    Args:
        file_path: Where to write (truncated if it exists).
        mark_cycles: Also mark every engine cycle.

    Example:

    ```python
    hvd.start_timeline("/tmp/hvdkeras_timeline.json")
    model.fit(...)
    hvd.stop_timeline()
    ```
    """
    require()
    library.engine_handle().hvdkeras_set_timeline(str(file_path).encode(), int(mark_cycles))


def stop_timeline() -> None:
    """Stops the trace started by `start_timeline` (or HVDKERAS_TIMELINE)."""
    require()
    library.engine_handle().hvdkeras_set_timeline(b"", 0)


def engine_config() -> EngineConfig:
    """The knobs the running engine uses (tuned values under autotune).

    Returns:
        An `EngineConfig`; `fusion_threshold` and `cycle_time_ms` are read
        from the engine, so they show what autotune has chosen so far.
        `shm_allreduce` and `hierarchical_allreduce` say what the engine
        chose for the hosts it runs on: whether large allreduces go through
        shared memory, and "on" or "off" for the hierarchical way ("auto"
        resolved; "off" on one host).

    Example:

    ```python
    print(hvd.engine_config().fusion_threshold)
    ```
    """
    config = require().config
    threshold, cycle_time_ms = c_api.current_params(library.engine_handle())
    path = c_api.allreduce_path(library.engine_handle())
    return dataclasses.replace(config, fusion_threshold=threshold, cycle_time_ms=cycle_time_ms,
                               shm_allreduce=path != "mpi",
                               hierarchical_allreduce="on" if path == "hierarchical" else "off")

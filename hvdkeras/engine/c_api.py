"""The engine's C entry points (ops/core/c_api.cc), typed for ctypes.

The engine's settings cross this seam as text, one "name=value" line per
`EngineConfig` field (see Note [engine settings] in
ops/core/engine_settings.def), so adding a setting changes no signature
here. The element types and reductions come back the same way (see Note
[wire vocabulary] in ops/core/types.def).

What may import this module: the rest of `hvdkeras.engine`.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
from typing import Any, Dict, Sequence

ERROR_CAPACITY = 1024
# Room for one rank's answer when ranks are asked what they are doing.
ASK_CAPACITY_PER_RANK = 2048


def bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declares the argument and result types of the entry points; returns `lib`."""
    lib.hvdkeras_engine_start.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                          ctypes.c_int]
    lib.hvdkeras_engine_start.restype = ctypes.c_int
    lib.hvdkeras_engine_default_settings.argtypes = []
    lib.hvdkeras_engine_default_settings.restype = ctypes.c_char_p
    lib.hvdkeras_vocabulary.argtypes = []
    lib.hvdkeras_vocabulary.restype = ctypes.c_char_p
    lib.hvdkeras_engine_stop.argtypes = []
    lib.hvdkeras_engine_stop.restype = None
    lib.hvdkeras_process_set_start.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p,
                                               ctypes.c_char_p, ctypes.c_int]
    lib.hvdkeras_process_set_start.restype = ctypes.c_int
    lib.hvdkeras_process_set_stop.argtypes = [ctypes.c_int]
    lib.hvdkeras_process_set_stop.restype = None
    lib.hvdkeras_engine_running.argtypes = []
    lib.hvdkeras_engine_running.restype = ctypes.c_int
    lib.hvdkeras_set_timeline.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.hvdkeras_set_timeline.restype = None
    lib.hvdkeras_current_params.argtypes = [ctypes.POINTER(ctypes.c_int64),
                                            ctypes.POINTER(ctypes.c_double)]
    lib.hvdkeras_current_params.restype = None
    lib.hvdkeras_engine_stats.argtypes = [ctypes.POINTER(ctypes.c_int64),
                                          ctypes.POINTER(ctypes.c_double)]
    lib.hvdkeras_engine_stats.restype = None
    lib.hvdkeras_negotiation_stats.argtypes = [ctypes.POINTER(ctypes.c_int64)]
    lib.hvdkeras_negotiation_stats.restype = None
    lib.hvdkeras_liveness_sockets.argtypes = []
    lib.hvdkeras_liveness_sockets.restype = ctypes.c_int
    lib.hvdkeras_allreduce_path.argtypes = []
    lib.hvdkeras_allreduce_path.restype = ctypes.c_char_p
    lib.hvdkeras_virtual_job.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_int,
                                         ctypes.c_char_p, ctypes.c_int64]
    lib.hvdkeras_virtual_job.restype = ctypes.c_int64
    # The TensorFlow binding's own entry points: absent from the engine library alone.
    for name in ("hvdkeras_xla_calls_built", "hvdkeras_xla_gpu_calls_built"):
        if hasattr(lib, name):
            getattr(lib, name).argtypes = []
            getattr(lib, name).restype = ctypes.c_int
    _bind_requests(lib)
    lib.hvdkeras_build_flavor.argtypes = []
    lib.hvdkeras_build_flavor.restype = ctypes.c_char_p
    lib.hvdkeras_gpu_set_library_dirs.argtypes = [ctypes.c_char_p]
    lib.hvdkeras_gpu_set_library_dirs.restype = None
    for name in ("hvdkeras_gpu_probe", "hvdkeras_gpu_build_info"):
        getattr(lib, name).argtypes = [ctypes.c_char_p, ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_int
    lib.hvdkeras_gpu_compile_kernels.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.hvdkeras_gpu_compile_kernels.restype = ctypes.c_int
    lib.hvdkeras_gpu_probe_copies.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int,
                                              ctypes.POINTER(ctypes.c_double), ctypes.c_char_p,
                                              ctypes.c_int]
    lib.hvdkeras_gpu_probe_copies.restype = ctypes.c_int
    lib.hvdkeras_gpu_set_kernel_cache_dir.argtypes = [ctypes.c_char_p]
    lib.hvdkeras_gpu_set_kernel_cache_dir.restype = None
    lib.hvdkeras_gpu_pin.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.hvdkeras_gpu_pin.restype = ctypes.c_int
    lib.hvdkeras_set_activity.argtypes = [ctypes.c_char_p]
    lib.hvdkeras_set_activity.restype = None
    lib.hvdkeras_ask_ranks.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                       ctypes.c_double, ctypes.c_char_p, ctypes.c_int]
    lib.hvdkeras_ask_ranks.restype = None
    return lib


def _bind_requests(lib: ctypes.CDLL) -> None:
    """The request entry points (ops/core/c_requests.cc) of the non-TensorFlow bindings."""
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.hvdkeras_request_submit.argtypes = [
        ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ptr), ctypes.POINTER(ptr),
        ctypes.POINTER(ctypes.c_int), ctypes.POINTER(i64), ctypes.c_int, ctypes.c_int,
        ctypes.c_double, ctypes.c_double, ctypes.c_int, ctypes.POINTER(i64), ctypes.c_int,
        ctypes.c_int, ctypes.c_int, ptr, ctypes.c_char_p, ctypes.c_int]
    lib.hvdkeras_request_submit.restype = i64
    lib.hvdkeras_request_wait.argtypes = [i64, ctypes.c_double, ctypes.c_char_p, ctypes.c_int]
    lib.hvdkeras_request_wait.restype = ctypes.c_int
    lib.hvdkeras_request_shape.argtypes = [i64, ctypes.c_int, ctypes.POINTER(i64), ctypes.c_int]
    lib.hvdkeras_request_shape.restype = ctypes.c_int
    lib.hvdkeras_request_output.argtypes = [i64, ctypes.c_int, ptr]
    lib.hvdkeras_request_output.restype = i64
    lib.hvdkeras_request_received_splits.argtypes = [i64, ctypes.POINTER(i64), ctypes.c_int]
    lib.hvdkeras_request_received_splits.restype = ctypes.c_int
    lib.hvdkeras_request_last_joined_rank.argtypes = [i64]
    lib.hvdkeras_request_last_joined_rank.restype = ctypes.c_int
    lib.hvdkeras_request_release.argtypes = [i64]
    lib.hvdkeras_request_release.restype = None


def settings_text(config: Any) -> str:
    """Every field of an `EngineConfig` dataclass as "name=value" lines.

    Booleans travel as 1/0 and numbers in Python's shortest exact form, which
    the engine parses back to the same value.

    Raises:
        ValueError: if a text value holds a newline (it would end the line).
    """
    lines = []
    for name, value in dataclasses.asdict(config).items():
        if isinstance(value, bool):
            text = "1" if value else "0"
        else:
            text = repr(value) if isinstance(value, float) else str(value)
        if "\n" in text or "\r" in text:
            raise ValueError(f"engine setting {name} may not contain a line break: {value!r}")
        lines.append(f"{name}={text}")
    return "".join(line + "\n" for line in lines)


def parse_settings(text: str) -> Dict[str, str]:
    """"name=value" lines -> {name: value text} (the engine's defaults, say)."""
    out = {}
    for line in text.splitlines():
        if line:
            name, _, value = line.partition("=")
            out[name] = value
    return out


def start(lib: ctypes.CDLL, fortran_comm: int, config: Any) -> None:
    """Starts the engine on a communicator (Fortran handle) with `config`.

    Raises:
        RuntimeError: with the engine's reason, if it did not start.
    """
    error = ctypes.create_string_buffer(ERROR_CAPACITY)
    rc = lib.hvdkeras_engine_start(fortran_comm, settings_text(config).encode(), error,
                                   len(error))
    if rc != 0:
        raise RuntimeError(f"hvdkeras engine failed to start: {error.value.decode()}")


def start_process_set(lib: ctypes.CDLL, set_id: int, fortran_comm: int, config: Any) -> None:
    """Starts process set `set_id`'s engine on its communicator (Fortran handle).

    Collective over the set's ranks; see Note [process set engines] in
    ops/core/engine.h.

    Raises:
        RuntimeError: with the engine's reason, if it did not start.
    """
    error = ctypes.create_string_buffer(ERROR_CAPACITY)
    rc = lib.hvdkeras_process_set_start(set_id, fortran_comm, settings_text(config).encode(),
                                        error, len(error))
    if rc != 0:
        raise RuntimeError(f"hvdkeras process set {set_id} failed to start: "
                           f"{error.value.decode()}")


def gpu_pin(lib: ctypes.CDLL, device: int) -> str:
    """Tells the engine this process's GPU and readies it (kernels, stream).

    Returns "" or why the GPU part cannot use it (the first GPU collective
    then fails with the same reason on every rank).
    """
    text = ctypes.create_string_buffer(ERROR_CAPACITY)
    rc = lib.hvdkeras_gpu_pin(device, text, len(text))
    return "" if rc == 0 else text.value.decode(errors="replace")


def set_activity(lib: ctypes.CDLL, what: str) -> None:
    """Tells the watchdog what this rank's Python thread is doing ("" : its own code)."""
    lib.hvdkeras_set_activity(what.encode())


def ask_ranks(lib: ctypes.CDLL, ranks: Sequence[int], wait_seconds: float) -> Dict[int, str]:
    """What each of `ranks` says it is doing (see Note [bounded waits] in
    ops/core/watchdog.h); waits at most `wait_seconds` for the answers."""
    ranks = list(ranks)
    array = (ctypes.c_int * max(len(ranks), 1))(*ranks)
    out = ctypes.create_string_buffer(ASK_CAPACITY_PER_RANK * max(len(ranks), 1))
    lib.hvdkeras_ask_ranks(array, len(ranks), wait_seconds, out, len(out))
    answers = {}
    for line in out.value.decode(errors="replace").splitlines():
        rank, _, answer = line.partition("\t")
        if rank.strip().lstrip("-").isdigit():
            answers[int(rank)] = answer
    return answers


def build_flavor(lib: ctypes.CDLL) -> str:
    """"cpu", or the GPU backend the library was built with ("cuda")."""
    return lib.hvdkeras_build_flavor().decode()


def gpu_probe(lib: ctypes.CDLL) -> tuple[int, str]:
    """(number of usable GPUs, description); (-1, the reason) when there are none."""
    text = ctypes.create_string_buffer(ERROR_CAPACITY)
    count = lib.hvdkeras_gpu_probe(text, len(text))
    return count, text.value.decode(errors="replace")


def gpu_build_info(lib: ctypes.CDLL) -> Dict[str, str]:
    """What the GPU part was built with and the libraries it finds ({} without one)."""
    text = ctypes.create_string_buffer(ERROR_CAPACITY * 4)
    if lib.hvdkeras_gpu_build_info(text, len(text)) != 0:
        return {}
    return parse_settings(text.value.decode(errors="replace"))


def gpu_compile_kernels(lib: ctypes.CDLL, arch: str) -> int:
    """Compiles the GPU kernels for `arch` ("sm_90"; no GPU needed); returns their size.

    Raises:
        RuntimeError: with the compiler's message.
    """
    text = ctypes.create_string_buffer(ERROR_CAPACITY * 16)
    if lib.hvdkeras_gpu_compile_kernels(arch.encode(), text, len(text)) != 0:
        raise RuntimeError(text.value.decode(errors="replace"))
    return int(text.value.decode())


def gpu_probe_copies(lib: ctypes.CDLL, tensors: int, bytes_each: int,
                     iterations: int) -> Dict[str, float]:
    """GB/s of the GPU's batched pack and unpack ("packed"), of a plain
    device-to-device copy of the same bytes ("plain") and of a scaled float32
    pack and unpack ("scaled").

    Raises:
        RuntimeError: without a usable GPU, with the reason.
    """
    results = (ctypes.c_double * 3)()
    text = ctypes.create_string_buffer(ERROR_CAPACITY)
    if lib.hvdkeras_gpu_probe_copies(tensors, bytes_each, iterations, results, text,
                                     len(text)) != 0:
        raise RuntimeError(text.value.decode(errors="replace"))
    return {"packed": results[0], "plain": results[1], "scaled": results[2]}


def engine_stats(lib: ctypes.CDLL) -> tuple[list, list]:
    """([ops, batches, bytes reduced, bytes gathered], [execute s, wait s]) since init()."""
    counts, seconds = (ctypes.c_int64 * 4)(), (ctypes.c_double * 2)()
    lib.hvdkeras_engine_stats(counts, seconds)
    return list(counts), list(seconds)


def negotiation_stats(lib: ctypes.CDLL) -> list:
    """[cycles, ops from the response cache, ops through rank 0, evictions, bytes of
    requests rank 0 received, the negotiation's own CPU nanoseconds (outside its
    exchanges)] since init()."""
    counts = (ctypes.c_int64 * 6)()
    lib.hvdkeras_negotiation_stats(counts)
    return list(counts)


def virtual_job(lib: ctypes.CDLL, ranks: int, tensors: int, steps: int = 3,
                allgathers: int = 0, shuffled: bool = True, stragglers: int = 0,
                cache_capacity: int = 16384, seed: int = 1, ranks_per_host: int = 8,
                arrival_cycles: int = 1, rank0_own_core: bool = True,
                rank0_evict_bytes: int = 0, with_order: bool = False) -> dict:
    """Runs the control plane's stand-in (ops/core/virtual_ranks.h): `ranks`
    virtual ranks in this process, each running the real negotiation and
    handing a step's tensors over in `arrival_cycles` cycles, rank 0's
    thread on a core of its own where there are 2 or more (`rank0_own_core`),
    rank 0 writing `rank0_evict_bytes` of its own before each cycle (its
    caches cold, Note [a cold rank 0]; 0: never).
    Needs no MPI and no running engine; returns its report as a dict."""
    params = (ctypes.c_int64 * 12)(ranks, tensors, steps, allgathers, int(shuffled), stragglers,
                                   cache_capacity, seed, ranks_per_host, arrival_cycles,
                                   int(rank0_own_core), rank0_evict_bytes)
    # Room for the most the report can hold: a step takes at most a cycle per
    # tensor and one more for stragglers (a row of under 256 characters each),
    # and each name is short.
    capacity = (1 << 16) + steps * (tensors + 2) * (256 + (48 if with_order else 0))
    out = ctypes.create_string_buffer(capacity)
    needed = lib.hvdkeras_virtual_job(params, int(with_order), out, capacity)
    if needed >= capacity:
        raise RuntimeError(f"the virtual job's report ({needed} bytes) outgrew its buffer "
                           f"({capacity} bytes)")
    return json.loads(out.value.decode())


def liveness_sockets(lib: ctypes.CDLL) -> int:
    """Sockets this rank holds for host liveness (Note [liveness tree])."""
    return int(lib.hvdkeras_liveness_sockets())


def allreduce_path(lib: ctypes.CDLL) -> str:
    """How the running engine reduces large CPU tensors: "shm", "hierarchical" or "mpi"."""
    return lib.hvdkeras_allreduce_path().decode()


def current_params(lib: ctypes.CDLL) -> tuple[int, float]:
    """(fusion threshold, cycle time in ms) the running engine uses."""
    threshold, cycle = ctypes.c_int64(), ctypes.c_double()
    lib.hvdkeras_current_params(ctypes.byref(threshold), ctypes.byref(cycle))
    return threshold.value, cycle.value

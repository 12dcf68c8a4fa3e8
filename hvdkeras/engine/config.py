"""Engine knobs read from the environment, validated before the engine starts.

Pure functions: nothing here touches MPI or TensorFlow, so the parsing rules
are unit-tested directly. `EngineConfig`'s fields are the engine's settings
(see Note [engine settings] in ops/core/engine_settings.def): `init()` hands
every one of them to the engine, and a test checks that both list the same
names with the same defaults.

What may import this module: anything, the launcher included (it imports
only the standard library).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

FUSION_THRESHOLD = "HVDKERAS_FUSION_THRESHOLD"
CYCLE_TIME = "HVDKERAS_CYCLE_TIME"
CACHE_CAPACITY = "HVDKERAS_CACHE_CAPACITY"
STALL_CHECK_SECONDS = "HVDKERAS_STALL_CHECK_SECONDS"
STALL_CHECK_DISABLE = "HVDKERAS_STALL_CHECK_DISABLE"
STALL_SHUTDOWN_SECONDS = "HVDKERAS_STALL_SHUTDOWN_SECONDS"
LIVENESS_SECONDS = "HVDKERAS_LIVENESS_SECONDS"
TIMELINE = "HVDKERAS_TIMELINE"
TIMELINE_MARK_CYCLES = "HVDKERAS_TIMELINE_MARK_CYCLES"
AUTOTUNE = "HVDKERAS_AUTOTUNE"
AUTOTUNE_LOG = "HVDKERAS_AUTOTUNE_LOG"
ALLREDUCE_CHUNK_BYTES = "HVDKERAS_ALLREDUCE_CHUNK_BYTES"
SHM_ALLREDUCE = "HVDKERAS_SHM_ALLREDUCE"
SHM_ARENA_BYTES = "HVDKERAS_SHM_ARENA_BYTES"
HIERARCHICAL_ALLREDUCE = "HVDKERAS_HIERARCHICAL_ALLREDUCE"
RING_COLLECTIVES = "HVDKERAS_RING_COLLECTIVES"
RING_MIN_BYTES = "HVDKERAS_RING_MIN_BYTES"
# "0" turns off the TensorFlow graph pass that runs a function's independent
# one-tensor allreduces in one kernel (Note [separate allreduces in one
# kernel] in ops/tf/separate_allreduces.cc, which reads the variable itself).
MERGE_SEPARATE_ALLREDUCES = "HVDKERAS_MERGE_SEPARATE_ALLREDUCES"
# Set by the launcher: the number of ranks it started. init() compares it with
# MPI's world size to catch an mpiexec of another MPI (N worlds of size 1).
EXPECTED_SIZE = "HVDKERAS_EXPECTED_SIZE"
# Whether a rank's uncaught exception ends the job with MPI_Abort (default 1).
# See Note [abort, not finalize] in hvdkeras/engine/failfast.py.
ABORT_ON_ERROR = "HVDKERAS_ABORT_ON_ERROR"
# How the gradients of allgather, broadcast and reducescatter are scaled:
# see Note [collective gradient conventions] in hvdkeras/collectives/gradients.py.
COLLECTIVE_GRADIENTS = "HVDKERAS_COLLECTIVE_GRADIENTS"
COLLECTIVE_GRADIENT_CONVENTIONS = ("exact", "horovod")
# Whether DistributedOptimizer reduces gradients in buckets while the backward
# pass runs: auto (default: when the ranks span several hosts or the gradients
# are on GPUs), 1 or 0; see
# Note [gradient buckets] in hvdkeras/engine/buckets.py. The torch backend's
# older name, when set, decides for torch (Note [reductions during the
# backward pass] in hvdkeras/backends/torch/backward_overlap.py).
BACKWARD_OVERLAP = "HVDKERAS_BACKWARD_OVERLAP"
TORCH_BACKWARD_OVERLAP = "HVDKERAS_TORCH_BACKWARD_OVERLAP"
# Whether a step's last gradient reductions finish while the next step's
# forward pass runs (Note [cross-step updates] in hvdkeras/training/cross_step.py).
CROSS_STEP_OVERLAP = "HVDKERAS_CROSS_STEP_OVERLAP"
# A gradient bucket's size in bytes (hvdkeras/engine/buckets.py).
BUCKET_BYTES = "HVDKERAS_BUCKET_BYTES"
# Whether zero_stage=3 under torch gathers the weights again for the backward
# pass instead of keeping them whole from the forward pass (default 1; Note
# [sharded parameters under torch] in hvdkeras/backends/torch/parameters.py).
ZERO3_REGATHER = "HVDKERAS_ZERO3_REGATHER"
# Whether zero_stage=3 under torch starts the next gather group's allgather
# while the current group computes (default 0), and the size of a gather
# group in bytes (Note [gathers started ahead] in
# hvdkeras/backends/torch/parameters.py; GATHER_GROUP_BYTES in
# hvdkeras/sharding/plan.py is the default size).
ZERO3_PREFETCH = "HVDKERAS_ZERO3_PREFETCH"
ZERO3_GROUP_BYTES = "HVDKERAS_ZERO3_GROUP_BYTES"
# Note [eager ring segments]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~
# UCX (the transport of the MPICH that mpi4py ships) sends a message of 8 KiB
# or more over TCP by rendezvous: the receiver must answer before the bytes
# move, so each ring segment (64 KiB to 1 MiB, RingSegmentBytes in
# ops/core/ring_plan.h) waits for both ranks' engine threads to be scheduled.
# While the framework computes a backward pass on every core, that wait is
# milliseconds, and the link idles: on the lab's 2 Gbit/s links ResNet-50's
# first gradient bucket took 80-230 ms instead of 32. Sent eagerly, a segment
# goes into the socket at once and the kernel's buffers carry it across a
# late peer (the ring posts its receives ahead, so nothing piles up unmatched).
# Idle, the same setting lifts a 3-host 256 MiB allreduce from 84% to 91% of
# the link. hvdkeras sets these where they are not set, before MPI starts
# (`init()`, and every rank hvdkerasrun starts).
MPI_TRANSPORT_DEFAULTS = {"UCX_RNDV_THRESH": "2mb"}
# Note [ranks started by srun]
# ~~~~~~~~~~~~~~~~~~~~~~~~~~~~
# Ranks that `srun --mpi=pmi2` starts itself (no hvdkerasrun, no mpiexec)
# exchange their network addresses through Slurm's PMI-2 plugin, which
# MPICH's PMI client talks to. With MPICH's UCX network module that exchange
# fails once TensorFlow and hvdkeras's libraries are in the process: MPICH
# splits the addresses into many long `put` requests and Slurm 22.05's plugin
# rejects them ("mpi/pmi2: value not properly terminated in client
# request"), so MPI_Init fails on every rank (measured on the lab's Slurm
# cluster; plain mpi4py, whose exchange is short, starts, and so does every
# job that hvdkerasrun starts inside an allocation, whose PMI server is
# Hydra's). MPICH's libfabric module with its tcp provider exchanges short
# addresses and starts, so hvdkeras chooses it there where the user chose no
# network module. It is the one place the transport differs from
# hvdkerasrun's; docs/launching.md says so.
SRUN_PMI2_TRANSPORT_DEFAULTS = {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"}
# Where rank 0 writes hvdkeras.elastic state commits (hvdkeras/training/elastic_state.py).
ELASTIC_STATE_DIR = "HVDKERAS_ELASTIC_STATE_DIR"
# The log level of `--log-level` (hvdkerasrun, hvdkeras): trace, debug, info,
# warning, error or fatal. Unset: warnings and errors only.
LOG_LEVEL = "HVDKERAS_LOG_LEVEL"
INFO_LOG_LEVELS = ("trace", "debug", "info")


def info_logs(environ=os.environ) -> bool:
    """Whether the user asked for informational messages (`--log-level info`
    or lower)."""
    return environ.get(LOG_LEVEL, "").strip().lower() in INFO_LOG_LEVELS

# Horovod's names for the same knobs, in the same units: a Horovod user's
# environment (HorovodRunner's documented HOROVOD_TIMELINE among them) keeps
# working. Where both names are set, ours wins and init() says so on rank 0.
HOROVOD_ALIASES = {
    "HOROVOD_FUSION_THRESHOLD": FUSION_THRESHOLD,
    "HOROVOD_CYCLE_TIME": CYCLE_TIME,
    "HOROVOD_CACHE_CAPACITY": CACHE_CAPACITY,
    "HOROVOD_STALL_CHECK_TIME_SECONDS": STALL_CHECK_SECONDS,
    "HOROVOD_STALL_CHECK_DISABLE": STALL_CHECK_DISABLE,
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": STALL_SHUTDOWN_SECONDS,
    "HOROVOD_TIMELINE": TIMELINE,
    "HOROVOD_TIMELINE_MARK_CYCLES": TIMELINE_MARK_CYCLES,
    "HOROVOD_AUTOTUNE": AUTOTUNE,
    "HOROVOD_AUTOTUNE_LOG": AUTOTUNE_LOG,
    "HOROVOD_HIERARCHICAL_ALLREDUCE": HIERARCHICAL_ALLREDUCE,
}
_ALIAS_OF = {ours: theirs for theirs, ours in HOROVOD_ALIASES.items()}

# Upper bounds: what the engine can represent, with room to spare.
MAX_FUSION_THRESHOLD = 1 << 40  # 1 TiB
MAX_CACHE_CAPACITY = 1 << 20
MAX_CYCLE_TIME_MS = 60_000.0
MAX_SHM_ARENA_BYTES = 1 << 40
MAX_SECONDS = 7 * 24 * 3600.0


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Settings of the background engine.

    Attributes:
        fusion_threshold: Largest fused buffer in bytes (0 disables fusion).
        cycle_time_ms: How long an idle rank waits between negotiation ticks,
            in milliseconds. Ranks with new work start a cycle at once.
        cache_capacity: Most entries in the response cache behind the fast
            negotiation path; it holds only the collectives the job runs
            (0 sends every request to the coordinator). Horovod's default
            is 1024; ours covers a 5,000-tensor model under ZeRO.
        stall_check_seconds: After this long, rank 0 warns about collectives
            that some ranks submitted and others did not (0 disables).
        stall_shutdown_seconds: After this long, such collectives fail on
            the ranks that submitted them, which ends the job (0: they wait
            forever). See Note [hang bound] in ops/core/engine_settings.def.
        liveness_seconds: A host none of whose ranks has been heard (over
            connections of the watchdog's own, beating every second) for
            this long, or half the stall bound when that is shorter, ends
            the job with an error naming it (0: only the stall bound ends
            it). See Note [host liveness] in ops/core/liveness.h.
        timeline_path: Rank 0 writes a Chrome trace here ("" for none).
        timeline_mark_cycles: Add a marker for every engine cycle.
        autotune: Tune the fusion threshold and cycle time online; a knob set
            explicitly in the environment keeps its value.
        autotune_log: Rank 0 writes one CSV row per autotune trial here.
        allreduce_chunk_bytes: Buffers larger than this are reduced as a
            sequence of in-place MPI calls of this many bytes, which keeps
            each piece in cache (0: one call per buffer).
        shm_allreduce: Reduce large tensors among the ranks of a host through
            a shared-memory window of the engine's own instead of MPI calls.
        hierarchical_allreduce: With ranks on several hosts: "on" reduces
            within each host through shared memory and only across hosts
            over MPI, one rank per host and slice; "off" runs one MPI
            allreduce over all ranks; "auto" (default) is "on" when some host
            runs several ranks. Needs `shm_allreduce`. See Note
            [hierarchical allreduce] in ops/core/allreduce_path.h.
        ring_collectives: "auto" (default) runs allreduces, reduce-scatters
            and allgathers of `ring_min_bytes` or more whose ranks span
            several hosts (one rank per host, or the hierarchical path's
            cross step) as a pipelined ring over MPI point-to-point
            messages, which moves the least data over each host's link at
            any host count; "on" takes the ring for every size, even on one
            host; "off" leaves everything to MPI's own algorithms. See Note
            [ring across hosts] in ops/core/ring_plan.h.
        ring_min_bytes: The smallest collective the ring takes under "auto".
        shm_arena_bytes: Shared memory per rank that results of the
            shared-memory allreduce live in, so they are not copied out (less
            when /dev/shm has less room; 0: always copy out). See Note
            [shared outputs] in ops/core/shm_arena.h.
        fusion_threshold_fixed: Whether the user set the fusion threshold.
        cycle_time_fixed: Whether the user set the cycle time.
    """

    fusion_threshold: int = 64 * 1024 * 1024
    cycle_time_ms: float = 1.0
    cache_capacity: int = 16384
    stall_check_seconds: float = 60.0
    stall_shutdown_seconds: float = 1800.0
    liveness_seconds: float = 60.0
    timeline_path: str = ""
    timeline_mark_cycles: bool = False
    autotune: bool = False
    autotune_log: str = ""
    allreduce_chunk_bytes: int = 1024 * 1024
    shm_allreduce: bool = True
    hierarchical_allreduce: str = "auto"
    ring_collectives: str = "auto"
    ring_min_bytes: int = 1024 * 1024
    shm_arena_bytes: int = 64 * 1024 * 1024
    fusion_threshold_fixed: bool = False
    cycle_time_fixed: bool = False


def _parse_int(env: Mapping[str, str], key: str, default: int, minimum: int,
               maximum: int) -> int:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(
            f"{key}={raw!r} is not a whole number; set it to an integer >= {minimum} "
            f"or unset it to use the default ({default})."
        ) from None
    if not minimum <= value <= maximum:
        raise ValueError(f"{key}={raw!r} must be >= {minimum} and <= {maximum} "
                         f"(default {default}).")
    return value


def _parse_float(env: Mapping[str, str], key: str, default: float, minimum: float,
                 maximum: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{key}={raw!r} is not a number; set it to a value > {minimum} "
            f"or unset it to use the default ({default})."
        ) from None
    if not minimum < value <= maximum:  # also rejects nan
        raise ValueError(f"{key}={raw!r} must be a number > {minimum} and <= {maximum} "
                         f"(default {default}).")
    return value


def _parse_seconds(env: Mapping[str, str], key: str, default: float) -> float:
    raw = env.get(key, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_SECONDS:  # also rejects nan and inf
        raise ValueError(f"{key}={raw!r} must be a number of seconds >= 0 and <= "
                         f"{MAX_SECONDS:g}; 0 turns it off (default {default}).")
    return value


def parse_bool(env: Mapping[str, str], key: str, default: bool = False) -> bool:
    """`env[key]` as a boolean (1/0, true/false, yes/no, on/off); `default` when unset."""
    raw = env.get(key, "").strip().lower()
    if not raw:
        return default
    if raw in ("0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{key}={env[key]!r} is not a boolean; use 1 or 0.")


def _parse_auto_switch(env: Mapping[str, str], key: str) -> str:
    raw = env.get(key, "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    try:
        return "on" if parse_bool(env, key) else "off"
    except ValueError:
        raise ValueError(f"{key}={env[key]!r}: use auto (the default), 1 (on) or 0 (off).") from None


def _parse_hierarchical(env: Mapping[str, str], key: str, shm_allreduce: bool) -> str:
    value = _parse_auto_switch(env, key)
    if value == "on" and not shm_allreduce:
        raise ValueError(f"{key}={env[key]!r} needs the shared-memory allreduce, but "
                         f"{SHM_ALLREDUCE}=0 turns it off; unset one of them.")
    return value


def collective_gradients(env: Optional[Mapping[str, str]] = None) -> str:
    """The convention in `HVDKERAS_COLLECTIVE_GRADIENTS`: "exact" (default) or "horovod"."""
    env = os.environ if env is None else env
    value = env.get(COLLECTIVE_GRADIENTS, "exact").strip().lower() or "exact"
    if value not in COLLECTIVE_GRADIENT_CONVENTIONS:
        raise ValueError(f"{COLLECTIVE_GRADIENTS}={env.get(COLLECTIVE_GRADIENTS)!r}: use one of "
                         f"{', '.join(COLLECTIVE_GRADIENT_CONVENTIONS)}.")
    return value


def torch_backward_overlap(env: Optional[Mapping[str, str]] = None) -> str:
    """`HVDKERAS_TORCH_BACKWARD_OVERLAP` when set, else `HVDKERAS_BACKWARD_OVERLAP`:
    "auto" (default), "on" or "off"."""
    env = os.environ if env is None else env
    if env.get(TORCH_BACKWARD_OVERLAP, "").strip():
        return _parse_auto_switch(env, TORCH_BACKWARD_OVERLAP)
    return _parse_auto_switch(env, BACKWARD_OVERLAP)


def zero3_regather(env: Optional[Mapping[str, str]] = None) -> bool:
    """`HVDKERAS_ZERO3_REGATHER` (default on). The same on every rank: it
    decides which collectives a step makes."""
    return parse_bool(os.environ if env is None else env, ZERO3_REGATHER, default=True)


def zero3_prefetch(env: Optional[Mapping[str, str]] = None) -> bool:
    """`HVDKERAS_ZERO3_PREFETCH` (default off). May differ between ranks: a
    gather started ahead carries the name of the one it replaces."""
    return parse_bool(os.environ if env is None else env, ZERO3_PREFETCH, default=False)


def zero3_group_bytes(default: int, env: Optional[Mapping[str, str]] = None) -> int:
    """`HVDKERAS_ZERO3_GROUP_BYTES`: a stage-3 gather group's size in bytes
    (`default` when unset). The same on every rank: it decides the plan."""
    env = os.environ if env is None else env
    return _parse_int(env, ZERO3_GROUP_BYTES, default, 1, 2**40)


def backward_overlap(env: Optional[Mapping[str, str]] = None) -> str:
    """`HVDKERAS_BACKWARD_OVERLAP`: "auto" (default), "on" or "off"."""
    env = os.environ if env is None else env
    return _parse_auto_switch(env, BACKWARD_OVERLAP)


def cross_step_overlap(env: Optional[Mapping[str, str]] = None) -> str:
    """`HVDKERAS_CROSS_STEP_OVERLAP`: "auto" (default), "on" or "off"."""
    env = os.environ if env is None else env
    return _parse_auto_switch(env, CROSS_STEP_OVERLAP)


def bucket_bytes(default: int, env: Optional[Mapping[str, str]] = None) -> int:
    """`HVDKERAS_BUCKET_BYTES`: a gradient bucket's size in bytes (`default`
    when unset; hvdkeras/engine/buckets.py holds it)."""
    env = os.environ if env is None else env
    return _parse_int(env, BUCKET_BYTES, default, 1, 2**40)


def transport_defaults(env: Mapping[str, str]) -> dict:
    """The variables of `MPI_TRANSPORT_DEFAULTS` that `env` does not set
    (Note [eager ring segments]), and under `srun --mpi=pmi2` those of
    `SRUN_PMI2_TRANSPORT_DEFAULTS` (Note [ranks started by srun]). Pure.

    Example:
        >>> transport_defaults({"UCX_RNDV_THRESH": "inf"})
        {}
    """
    wanted = dict(MPI_TRANSPORT_DEFAULTS)
    if (env.get("SLURM_MPI_TYPE", "").strip() == "pmi2" and env.get("PMI_FD", "").strip()
            and not env.get("MPIR_CVAR_CH4_NETMOD", "").strip()):
        wanted.update(SRUN_PMI2_TRANSPORT_DEFAULTS)  # Note [ranks started by srun]
    return {k: v for k, v in wanted.items() if not env.get(k, "").strip()}


def source_of(env: Mapping[str, str], key: str) -> str:
    """The variable a knob is read from: ours (`key`) when set, else Horovod's alias
    when that is set, else `key`. Pure."""
    if env.get(key, "").strip():
        return key
    alias = _ALIAS_OF.get(key)
    return alias if alias and env.get(alias, "").strip() else key


def ignored_horovod_aliases(env: Mapping[str, str]) -> list:
    """One line for each Horovod variable that is set but loses to ours. Pure."""
    return [f"{theirs}={env[theirs].strip()!r} is ignored: {ours}={env[ours].strip()!r} is set"
            for theirs, ours in HOROVOD_ALIASES.items()
            if env.get(theirs, "").strip() and env.get(ours, "").strip()
            and env[theirs].strip() != env[ours].strip()]


def engine_config_from_env(env: Optional[Mapping[str, str]] = None) -> EngineConfig:
    """Reads the engine knobs from `env` (default: `os.environ`).

    Args:
        env: A mapping of environment variables.

    Returns:
        The validated `EngineConfig`.

    Raises:
        ValueError: naming the variable, its value and what is allowed.

    Example:

    >>> engine_config_from_env({"HVDKERAS_CYCLE_TIME": "2.5"}).cycle_time_ms
    2.5
    """
    env = os.environ if env is None else env
    defaults = EngineConfig()

    def key(name: str) -> str:  # ours, or Horovod's name for it (HOROVOD_ALIASES)
        return source_of(env, name)

    stall_check_seconds = _parse_seconds(env, key(STALL_CHECK_SECONDS),
                                         defaults.stall_check_seconds)
    stall_check_disabled = parse_bool(env, key(STALL_CHECK_DISABLE))
    shm_allreduce = parse_bool(env, SHM_ALLREDUCE, default=True)
    return EngineConfig(
        fusion_threshold=_parse_int(env, key(FUSION_THRESHOLD), defaults.fusion_threshold, 0,
                                    MAX_FUSION_THRESHOLD),
        cycle_time_ms=_parse_float(env, key(CYCLE_TIME), defaults.cycle_time_ms, 0.0,
                                   MAX_CYCLE_TIME_MS),
        cache_capacity=_parse_int(env, key(CACHE_CAPACITY), defaults.cache_capacity, 0,
                                  MAX_CACHE_CAPACITY),
        stall_check_seconds=(0.0 if stall_check_disabled else stall_check_seconds),
        stall_shutdown_seconds=_parse_seconds(env, key(STALL_SHUTDOWN_SECONDS),
                                              defaults.stall_shutdown_seconds),
        liveness_seconds=_parse_seconds(env, LIVENESS_SECONDS, defaults.liveness_seconds),
        timeline_path=env.get(key(TIMELINE), "").strip(),
        timeline_mark_cycles=parse_bool(env, key(TIMELINE_MARK_CYCLES)),
        autotune=parse_bool(env, key(AUTOTUNE)),
        autotune_log=env.get(key(AUTOTUNE_LOG), "").strip(),
        allreduce_chunk_bytes=_parse_int(env, ALLREDUCE_CHUNK_BYTES,
                                         defaults.allreduce_chunk_bytes, 0,
                                         MAX_FUSION_THRESHOLD),
        shm_allreduce=shm_allreduce,
        hierarchical_allreduce=_parse_hierarchical(env, key(HIERARCHICAL_ALLREDUCE),
                                                   shm_allreduce),
        ring_collectives=_parse_auto_switch(env, RING_COLLECTIVES),
        ring_min_bytes=_parse_int(env, RING_MIN_BYTES, defaults.ring_min_bytes, 0,
                                  MAX_FUSION_THRESHOLD),
        shm_arena_bytes=_parse_int(env, SHM_ARENA_BYTES, defaults.shm_arena_bytes, 0,
                                   MAX_SHM_ARENA_BYTES),
        fusion_threshold_fixed=bool(env.get(key(FUSION_THRESHOLD), "").strip()),
        cycle_time_fixed=bool(env.get(key(CYCLE_TIME), "").strip()),
    )

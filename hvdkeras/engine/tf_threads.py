"""Sizes TensorFlow's thread pools so that ranks on one host share its cores.

TensorFlow gives every process an intra-op and an inter-op pool as large as
the cores it may run on. With N ranks on one host that is N times too many
threads: they spin and preempt each other and the engine thread, and every
small step pays for it. `hvdkeras.init()` therefore gives each rank its share
of the cores, unless the user chose the sizes (environment or
`tf.config.threading`) or `HVDKERAS_TF_THREADS=0` turns the policy off.
Where ranks share cores, their idle pool threads also go to sleep at once
instead of spinning on a core another rank's threads are waiting for (the
same reason OpenMP runtimes are told `OMP_WAIT_POLICY=passive` when
oversubscribed).

The policy itself (`parse_setting`, `sharing_ranks`, `threads_per_rank`) is
pure and tested without MPI or TensorFlow; `apply` is the one place that
touches TensorFlow (through `hvdkeras.compat.disable_thread_spinning` for the
spinning, which has no public setter).

What may import this module: `hvdkeras.engine.world`, which applies the
policy in `init()`.
"""

from __future__ import annotations

import os
import warnings
from typing import Mapping, Optional, Sequence

from hvdkeras import compat

TF_THREADS = "HVDKERAS_TF_THREADS"
TF_ENV_KNOBS = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")

AUTO = -1  # share the cores between the ranks of a host
OFF = 0  # leave TensorFlow's pools as TensorFlow sizes them


def parse_setting(env: Optional[Mapping[str, str]] = None) -> int:
    """Reads `HVDKERAS_TF_THREADS`.

    Args:
        env: The environment to read (default `os.environ`).

    Returns:
        `AUTO` when unset or "auto", `OFF` for "0" or "off", else the number
        of threads each pool gets on every rank.

    Raises:
        ValueError: for anything else, naming the knob and what it accepts.

    Example:

    ```python
    parse_setting({"HVDKERAS_TF_THREADS": "4"})  # 4
    ```
    """
    raw = (os.environ if env is None else env).get(TF_THREADS, "").strip().lower()
    if raw in ("", "auto"):
        return AUTO
    if raw in ("0", "off"):
        return OFF
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 1:
        raise ValueError(
            f"{TF_THREADS}={raw!r} is not valid: use 'auto' (share the host's cores between "
            "its ranks, the default), 'off' or 0 (keep TensorFlow's own pool sizes), or a "
            "positive number of threads per pool."
        )
    return value


def sharing_ranks(my_cpus: Sequence[int], local_cpu_sets: Sequence[Sequence[int]]) -> int:
    """How many ranks of this host may run on any of this rank's CPUs, this one included.

    Args:
        my_cpus: The CPUs this rank may run on.
        local_cpu_sets: The same for every rank on this host, this one included.

    Returns:
        At least 1.

    Example:

    ```python
    sharing_ranks([0, 1], [[0, 1], [0, 1], [2, 3]])  # 2
    ```
    """
    mine = set(my_cpus)
    return max(1, sum(1 for cpus in local_cpu_sets if mine.intersection(cpus)))


def threads_per_rank(my_cpus: Sequence[int], local_cpu_sets: Sequence[Sequence[int]]) -> int:
    """How many threads each TensorFlow pool of this rank should have.

    The ranks whose allowed CPUs overlap this rank's compete for them, so
    they split them evenly. A launcher that binds each rank to cores of its
    own leaves every rank all of its cores.

    Args:
        my_cpus: The CPUs this rank may run on.
        local_cpu_sets: The same for every rank on this host, this one included.

    Returns:
        At least 1.

    Example:

    ```python
    threads_per_rank([0, 1, 2, 3], [[0, 1, 2, 3], [0, 1, 2, 3]])  # 2
    threads_per_rank([0, 1], [[0, 1], [2, 3]])                    # 2
    ```
    """
    return max(1, len(set(my_cpus)) // sharing_ranks(my_cpus, local_cpu_sets))


def allowed_cpus() -> list:
    """The CPUs this process may run on (all of them where affinity is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def apply(threads: int, warn: bool, spin: bool = True) -> Optional[int]:
    """Sets both TensorFlow pools to `threads`, unless the user already chose.

    Args:
        threads: Threads per pool.
        warn: Whether to warn when TensorFlow is already running and so can no
            longer be changed (hvdkeras passes True on rank 0 only).
        spin: False makes idle pool threads sleep at once instead of
            spinning first (for ranks that share cores).

    Returns:
        `threads` if the pools were set, else None.
    """
    if any(os.environ.get(knob) for knob in TF_ENV_KNOBS):
        return None
    import tensorflow as tf  # lazy: the policy above is pure and used without TensorFlow

    threading = tf.config.threading
    if (threading.get_intra_op_parallelism_threads()
            or threading.get_inter_op_parallelism_threads()):
        return None
    try:
        threading.set_intra_op_parallelism_threads(threads)
        threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        if warn:
            warnings.warn(
                "hvdkeras.init() ran after TensorFlow had started, so every rank on this host "
                "keeps thread pools sized for all of its cores, which slows small steps. Call "
                f"hvdkeras.init() before running any TensorFlow op, or set {TF_THREADS}=0 to "
                "silence this.",
                RuntimeWarning,
                stacklevel=4,  # the caller of hvdkeras.init()
            )
        return None
    if not spin:
        compat.disable_thread_spinning()
    return threads

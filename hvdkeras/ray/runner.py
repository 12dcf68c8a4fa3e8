"""`hvdkeras.ray.run`: a function on N Ray actors, one rank per actor.

The ranks form one MPI world as `hvdkeras.cluster.job` describes. Here: a
placement group of N bundles (spread over the nodes or packed onto few), one
actor per bundle that runs `run_task_rank`, the driver's address as the
actors reach it, and ending the actors after a failure or a timeout.
"""

from __future__ import annotations

import os
import shlex
import time
from typing import Any, Callable, Optional, Sequence

import cloudpickle

from hvdkeras.cluster import task_env
from hvdkeras.cluster.job import (CANCEL_GRACE_S, POLL_S, JobState, rank_command,
                                  results_or_raise, run_task_rank)
from hvdkeras.runner.function_runner import RankFailedError
from hvdkeras.runner.service import Service, new_secret

WHAT = "hvdkeras.ray.run"
# The address the actors reach this driver at, where Ray's own guess is not
# it: a driver connected through Ray Client (ray://HOST:10001) from a machine
# outside the cluster's network, where Ray names this machine's default route.
DRIVER_HOST_ENV = "HVDKERAS_RAY_DRIVER_HOST"
# Ray's placement strategies: SPREAD puts the ranks on as many nodes as it
# can, PACK on as few; the STRICT_ forms fail instead of bending.
PLACEMENTS = ("SPREAD", "PACK", "STRICT_SPREAD", "STRICT_PACK")
DEFAULT_START_TIMEOUT_S = task_env.DEFAULT_START_TIMEOUT_S


class RankActor:
    """One rank's task: starts the rank on the actor's node and supervises it."""

    def run(self, index: int, size: int, address: str, secret_hex: str, env: dict,
            executable: Optional[str], mpi_args: Sequence[str]) -> int:
        # The rank's command is resolved on the actor's node: its Python and mpiexec.
        command = rank_command(executable, mpi_args, WHAT)
        return run_task_rank(index, size, address, secret_hex, env, command, WHAT)


def check_arguments(num_proc: Any, placement: str, cpus_per_rank: Any, gpus_per_rank: Any,
                    timeout: Any, start_timeout: Any) -> None:
    """Raises ValueError naming the bad argument (pure: no Ray needed)."""
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"num_proc must be a whole number >= 1, got {num_proc!r}.")
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}.")
    if not isinstance(cpus_per_rank, (int, float)) or not cpus_per_rank > 0:
        raise ValueError(f"cpus_per_rank must be a number > 0, got {cpus_per_rank!r}.")
    if not isinstance(gpus_per_rank, (int, float)) or gpus_per_rank < 0:
        raise ValueError(f"gpus_per_rank must be a number >= 0, got {gpus_per_rank!r}.")
    for name, value in (("timeout", timeout), ("start_timeout", start_timeout)):
        if value is not None and not (isinstance(value, (int, float)) and value > 0):
            raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}.")


def run(fn: Callable, args: Sequence = (), kwargs: Optional[dict] = None,
        num_proc: Optional[int] = None, env: Optional[dict[str, str]] = None,
        cpus_per_rank: float = 1, gpus_per_rank: float = 0, placement: str = "SPREAD",
        start_timeout: Optional[float] = None, timeout: Optional[float] = None,
        extra_mpi_args: Optional[str] = None, executable: Optional[str] = None) -> list:
    """Runs ``fn(*args, **kwargs)`` on `num_proc` Ray actors, one hvdkeras rank per actor.

    `hvdkeras.init()` has already been called on the ranks' world when `fn`
    starts (calling it again is harmless), so the body is the same as for
    `hvdkeras.run` and `hvdkeras.spark.run`. Ray is initialised with
    `ray.init()` if the caller has not done it (call `ray.init(address=...)`
    first to use a cluster).

    Args:
        fn: A function cloudpickle can ship; closures are fine.
        args: Its positional arguments.
        kwargs: Its keyword arguments.
        num_proc: Number of ranks = actors (required).
        env: Extra environment variables for the ranks (e.g. HVDKERAS_* knobs).
        cpus_per_rank: CPUs each actor reserves.
        gpus_per_rank: GPUs each actor reserves.
        placement: Ray's placement strategy for the ranks' bundles:
            "SPREAD" (default), "PACK", "STRICT_SPREAD" or "STRICT_PACK".
        start_timeout: Seconds for the ranks to be placed, start and join
            (default 300).
        timeout: Seconds for the whole run; then the ranks are ended and
            RankFailedError raised (default: none).
        extra_mpi_args: More arguments for each actor's `mpiexec` (a string,
            split as a shell would).
        executable: The Python the ranks run (default: the actor's own).

    Returns:
        The results of all ranks, in rank order.

    Raises:
        ValueError: a bad argument (before anything starts).
        RankFailedError: a rank raised (its traceback is in the message) or
            died, the ranks could not be placed in time, or the run timed out.
        ImportError: ray is not installed (``pip install "hvdkeras[ray]"``).

    Example:

    ```python
    import ray, hvdkeras.ray

    ray.init()
    def fn():
        import hvdkeras as hvd
        return hvd.rank(), float(hvd.allreduce([1.0], op=hvd.Sum)[0])
    hvdkeras.ray.run(fn, num_proc=2)  # [(0, 2.0), (1, 2.0)]
    ```
    """
    check_arguments(num_proc, placement, cpus_per_rank, gpus_per_rank, timeout, start_timeout)
    try:
        import ray  # lazy: an optional extra (hvdkeras[ray])
        from ray.util.placement_group import (  # lazy: the same extra
            placement_group, remove_placement_group)
        from ray.util.scheduling_strategies import (  # lazy: the same extra
            PlacementGroupSchedulingStrategy)
    except ImportError as exc:
        raise ImportError(f"hvdkeras.ray needs ray: pip install 'hvdkeras[ray]' ({exc})") from exc
    if not ray.is_initialized():
        ray.init()
    start_timeout = DEFAULT_START_TIMEOUT_S if start_timeout is None else float(start_timeout)
    state = JobState(cloudpickle.dumps((fn, tuple(args), dict(kwargs or {}))), num_proc)
    secret = new_secret()
    rank_env = dict(env or {})
    rank_env[task_env.START_TIMEOUT_ENV] = str(start_timeout)
    mpi_args = shlex.split(extra_mpi_args or "")
    bundle = {"CPU": float(cpus_per_rank)}
    if gpus_per_rank:
        bundle["GPU"] = float(gpus_per_rank)
    host = os.environ.get(DRIVER_HOST_ENV, "").strip() or ray.util.get_node_ip_address()
    timed_out = False
    engine_error: Optional[BaseException] = None
    with Service(secret, state.handle, host=host, max_connections=4 * num_proc + 16) as service:
        address = f"{host}:{service.port}"
        group = placement_group([dict(bundle) for _ in range(num_proc)], strategy=placement)
        actors: list = []
        try:
            ready, _ = ray.wait([group.ready()], timeout=start_timeout)
            if not ready:
                raise RankFailedError(
                    f"{WHAT}: Ray could not place {num_proc} ranks of {bundle} each "
                    f"({placement}) within {start_timeout:g} s; the cluster has "
                    f"{ray.cluster_resources()}.")
            actor_class = ray.remote(RankActor)
            for index in range(num_proc):
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=group, placement_group_bundle_index=index)
                actors.append(actor_class.options(
                    num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                    scheduling_strategy=strategy).remote())
            pending = [actor.run.remote(index, num_proc, address, secret.hex(), rank_env,
                                        executable, mpi_args)
                       for index, actor in enumerate(actors)]
            deadline = None if timeout is None else time.monotonic() + timeout
            failed_at = None
            while pending:
                done, pending = ray.wait(pending, num_returns=1, timeout=POLL_S)
                for ref in done:
                    try:
                        ray.get(ref)
                    except Exception as exc:  # the rank's own report comes first below
                        engine_error = engine_error or exc
                now = time.monotonic()
                if deadline is not None and now > deadline and not timed_out:
                    with state.lock:
                        state.abort_reason = (state.abort_reason
                                              or f"the run timed out after {timeout:g} s")
                    state.failed.set()
                    timed_out = True
                if state.failed.is_set():
                    failed_at = failed_at or now
                    if now - failed_at > CANCEL_GRACE_S:
                        break  # the rest are ended below
        finally:
            for actor in actors:
                ray.kill(actor)
            remove_placement_group(group)
    return results_or_raise(state, num_proc, WHAT, engine_error=engine_error,
                            timed_out_after=timeout if timed_out else None)

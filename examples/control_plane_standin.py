"""The control plane's stand-in as examples/control_plane_benchmark.py runs
it: a virtual job's figures (--simulate), rank 0's caches modelled (Note [a
cold rank 0] in ops/core/virtual_ranks.cc), and the stand-in's prediction of
a real run beside it (--real)."""

from __future__ import annotations

from pathlib import Path


def run_simulated(ranks: int, tensors: int, steps: int, stragglers: int, allgathers: int,
                  cache_capacity: int, ranks_per_host: int, link, arrival_cycles: int = 1,
                  shuffled: bool = True, rank0_own_core: bool = True,
                  rank0_caches: str = "auto") -> dict:
    """Runs the stand-in and returns its figures (control_plane_model.summarize);
    `rank0_caches` one of CACHE_MODELS, or "auto": cold, so that every size
    meets its cycles alike (Note [a cold rank 0])."""
    from hvdkeras.engine import c_api, library
    from hvdkeras.engine.control_plane_model import summarize

    if rank0_caches == "auto":
        rank0_caches = "cold"
    evict = eviction_bytes(rank0_caches)
    report = c_api.virtual_job(library.engine_handle(), ranks, tensors, steps=steps + 1,
                               allgathers=allgathers, stragglers=stragglers,
                               cache_capacity=cache_capacity, ranks_per_host=ranks_per_host,
                               arrival_cycles=arrival_cycles, shuffled=shuffled,
                               rank0_own_core=rank0_own_core, rank0_evict_bytes=evict)
    if report["error"]:
        raise RuntimeError(f"the simulated job failed: {report['error']}")
    result = summarize(report, ranks, tensors, link)
    result["rank0_caches"] = (f"{rank0_caches} ({evict >> 20} MiB written before each of its "
                              f"cycles)" if evict else "warm (shared with the other virtual ranks)")
    return result


def eviction_bytes(rank0_caches: str) -> int:
    """What the stand-in's rank 0 writes before each cycle (Note [a cold rank
    0] in ops/core/virtual_ranks.cc): for "cold" twice this machine's
    last-level cache (at least 64 MiB), for "private" twice the largest
    cache this core does not share (at least 4 MiB), for "warm" nothing."""
    if rank0_caches == "warm":
        return 0
    largest = {"cold": 0, "private": 0}
    cpu0 = Path("/sys/devices/system/cpu/cpu0")
    try:  # a core's own caches are shared by its hardware threads alone
        own = {"0", (cpu0 / "topology" / "thread_siblings_list").read_text().strip()}
    except OSError:
        own = {"0"}
    for index in (cpu0 / "cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
            shared = (index / "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if not digits.isdigit():
            continue
        size = int(digits) * scale
        largest["cold"] = max(largest["cold"], size)
        if shared in own:
            largest["private"] = max(largest["private"], size)
    floor = {"cold": 64 << 20, "private": 4 << 20}[rank0_caches]
    return max(2 * largest[rank0_caches], floor)


CACHE_MODELS = ("cold", "private", "warm")


# What the stand-in predicts of a real run, and the real figure it is held to.
PREDICTED = {"first_step_rank0_bytes_in": "first_step_rank0_bytes_in",
             "first_step_rank0_negotiation_cpu_s": "first_step_rank0_cpu_s",
             "steady_step_rank0_negotiation_cpu_us": "steady_step_rank0_cpu_us"}


# A real steady cycle at least this long (wall time) means other processes
# ran on rank 0's cores between its cycles: several of the scheduler's time
# slices with more ranks than cores.
COLD_CYCLE_US = 10_000.0


def prediction_caches(steady_cycle_us: float) -> str:
    """The stand-in's model of rank 0's caches for a real run whose steady
    cycle took `steady_cycle_us` (Note [a cold rank 0]): between short
    cycles little runs but rank 0's own Python or framework thread, which
    displaces its core's caches and leaves its share of the last level
    (private); between long ones the other ranks' processes have run through
    the same caches as well (cold)."""
    return "cold" if steady_cycle_us >= COLD_CYCLE_US else "private"


def predict_real(result: dict, rank0_caches: str = "auto") -> dict:
    """The stand-in run for the real run's ranks (one host), tensors and
    steps: its figures beside the real ones, and real / predicted."""
    from hvdkeras.engine.control_plane_model import Link

    if rank0_caches == "auto":
        rank0_caches = prediction_caches(result["steady_cycle_us"])

    ranks, tensors, steps = result["ranks"], result["tensors"], result["steps"]
    # The virtual ranks hand their tensors over in the real ranks' order (the
    # same on every rank) and in as many cycles as the real ones took (Python
    # submits one by one while the engine cycles), rank 0 sharing the cores
    # with the others as the real rank 0 does here. The link does not enter
    # these figures (CPU and bytes only). Each model of rank 0's caches is run
    # (its steady step beside the real one under
    # `steady_step_real_over_predicted_by_caches`); `rank0_caches` gives
    # `predicted`.
    spread = max(1, round(result["steady_cycles_per_step"]))
    runs = {model: run_simulated(ranks, tensors, steps, 0, 0, 16384, ranks, Link(1e-6, 1e9),
                                 arrival_cycles=spread, shuffled=False, rank0_own_core=False,
                                 rank0_caches=model)
            for model in CACHE_MODELS}
    simulated = runs[rank0_caches]
    predicted = {real_key: simulated[key] for real_key, key in PREDICTED.items()}
    steady = "steady_step_rank0_negotiation_cpu_us"
    return {"predicted": predicted, "predicted_rank0_caches": simulated["rank0_caches"],
            "real_over_predicted": {k: round(result[k] / v, 3) if v else None
                                    for k, v in predicted.items()},
            "steady_step_real_over_predicted_by_caches": {
                model: round(result[steady] / run["steady_step_rank0_cpu_us"], 3)
                if run["steady_step_rank0_cpu_us"] else None for model, run in runs.items()}}

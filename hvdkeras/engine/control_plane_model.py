"""The network's share of a control-plane cycle, modelled (pure).

The stand-in of a large job (`ops/core/virtual_ranks.h`) runs the real
negotiation for N virtual ranks in one process and counts what each cycle
exchanges; the time those exchanges would take on a real network comes from
here: latency times the tree's depth for each collective, plus bytes over
bandwidth where they pile up (at rank 0 for a gather). The constants are
measured (`examples/control_plane_benchmark.py` measures them with raw MPI
on the machine it runs on) or given for a fabric.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Dict, Iterable, List, Sequence

# The fields of each cycle the stand-in reports, in order.
CYCLE_FIELDS = ("step", "rank0_cpu_s", "cached", "negotiated", "allreduces", "allreduce_bytes",
                "gathers", "gather_bytes_at_root", "broadcasts", "broadcast_bytes")


@dataclasses.dataclass(frozen=True)
class Link:
    """What one message costs: a fixed latency and bytes over a bandwidth.

    Args:
        latency_s: one message's latency, in seconds.
        bytes_per_s: one link's bandwidth, in bytes per second.
        source: where the numbers came from (printed with the results).
    """

    latency_s: float
    bytes_per_s: float
    source: str = "given"


def tree_depth(ranks: int) -> int:
    """Rounds of a binomial tree or recursive doubling over `ranks` ranks.

    Example:
        >>> tree_depth(1), tree_depth(2), tree_depth(1000)
        (0, 1, 10)
    """
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    return math.ceil(math.log2(ranks)) if ranks > 1 else 0


def allreduce_s(ranks: int, nbytes: int, link: Link) -> float:
    """A small allreduce by recursive doubling: every round sends the whole vector."""
    return tree_depth(ranks) * (link.latency_s + nbytes / link.bytes_per_s)


def gather_s(ranks: int, bytes_at_root: int, link: Link) -> float:
    """A gather up a binomial tree: the depth's latency, then everything reaches rank 0."""
    return tree_depth(ranks) * link.latency_s + bytes_at_root / link.bytes_per_s


def broadcast_s(ranks: int, nbytes: int, link: Link) -> float:
    """A broadcast: a binomial tree, or scatter then allgather when that is faster."""
    depth = tree_depth(ranks)
    binomial = depth * (link.latency_s + nbytes / link.bytes_per_s)
    scatter_allgather = 2 * depth * link.latency_s + 2 * nbytes / link.bytes_per_s
    return min(binomial, scatter_allgather) if ranks > 1 else 0.0


def cycle_seconds(cycle: Dict[str, float], ranks: int, link: Link) -> float:
    """A cycle's modelled wall time: rank 0's own CPU plus its exchanges.

    Args:
        cycle: one cycle as the stand-in reports it (keys of CYCLE_FIELDS).
        ranks: the job's rank count.
        link: the network's constants.

    Returns:
        Seconds. A collective's share of its rank's CPU is in the model, not in
        `rank0_cpu_s`, which covers the negotiation's own work only.
    """
    per_allreduce = cycle["allreduce_bytes"] / max(cycle["allreduces"], 1)
    per_broadcast = cycle["broadcast_bytes"] / max(cycle["broadcasts"], 1)
    return (cycle["rank0_cpu_s"]
            + cycle["allreduces"] * allreduce_s(ranks, int(per_allreduce), link)
            + cycle["gathers"] * gather_s(ranks, 0, link)
            + cycle["gather_bytes_at_root"] / link.bytes_per_s
            + cycle["broadcasts"] * broadcast_s(ranks, int(per_broadcast), link))


def as_cycles(rows: Iterable[Sequence[float]]) -> List[Dict[str, float]]:
    """The stand-in's cycle rows as dicts keyed by CYCLE_FIELDS."""
    return [dict(zip(CYCLE_FIELDS, row)) for row in rows]


def summarize(report: dict, ranks: int, tensors: int, link: Link) -> dict:
    """The figures `control_plane_benchmark.py --simulate` prints, from a
    stand-in report (`c_api.virtual_job`). Pure.

    Args:
        report: what the stand-in returned.
        ranks: its virtual rank count.
        tensors: its tensors per step.
        link: the network's constants.

    Returns:
        A dict of the first step's and the steady cycles' costs at rank 0,
        the bytes rank 0 received and the modelled wall times.

    Example:
        >>> link = Link(2e-6, 10e9)
        >>> rows = [[0, 0.01, 0, 4, 1, 24, 2, 800, 2, 400], [1, 1e-4, 4, 0, 1, 24, 0, 0, 0, 0]]
        >>> out = summarize({"cycles": rows, "agreed": True, "exact": True, "error": "",
        ...                  "rank0_table_peak_bytes": 1 << 20, "rank0_liveness_sockets": 0},
        ...                 8, 4, link)
        >>> out["first_step_rank0_cpu_s"], out["cached_fraction"]
        (0.01, 1.0)
    """
    cycles = as_cycles(report["cycles"])
    first = [c for c in cycles if c["step"] == 0]
    steady = [c for c in cycles if c["step"] > 0]
    cached = sum(c["cached"] for c in steady)
    negotiated = sum(c["negotiated"] for c in steady)
    first_bytes = sum(c["gather_bytes_at_root"] for c in first)
    # Medians: on a shared machine one cycle in ten can take several times the
    # others (a preemption's cold caches), and the typical cycle is the cost.
    steady_cpu = statistics.median([c["rank0_cpu_s"] for c in steady] or [0.0])
    per_step: Dict[float, float] = {}
    for c in steady:
        per_step[c["step"]] = per_step.get(c["step"], 0.0) + c["rank0_cpu_s"]
    step_cpu = statistics.median(list(per_step.values()) or [0.0])
    return {
        "ranks": ranks, "tensors": tensors, "agreed": report["agreed"], "exact": report["exact"],
        "error": report["error"],
        "first_step_cycles": len(first),
        "first_step_rank0_cpu_s": round(sum(c["rank0_cpu_s"] for c in first), 6),
        "first_step_rank0_bytes_in": int(first_bytes),
        "first_step_modelled_s": round(sum(cycle_seconds(c, ranks, link) for c in first), 6),
        "steady_cycles_per_step": round(len(steady) / max(1, len({c["step"] for c in steady})), 2),
        "steady_cycle_rank0_cpu_us": round(steady_cpu * 1e6, 1),
        "steady_step_rank0_cpu_us": round(step_cpu * 1e6, 1),
        "steady_cycle_rank0_bytes_in": int(sum(c["gather_bytes_at_root"] for c in steady)
                                           / max(len(steady), 1)),
        "steady_cycle_modelled_us": round(
            sum(cycle_seconds(c, ranks, link) for c in steady) / max(len(steady), 1) * 1e6, 1),
        "cached_fraction": round(cached / max(cached + negotiated, 1), 4),
        # Counted: the gathered digests of the first step's largest cycle and
        # the coordinator's tables at their peak.
        "rank0_peak_mib": round((max((c["gather_bytes_at_root"] for c in first), default=0)
                                 + report["rank0_table_peak_bytes"]) / 2 ** 20, 1),
        "rank0_liveness_sockets": report["rank0_liveness_sockets"],
        "link": dataclasses.asdict(link),
    }

"""The engine's time by phase, from a timeline (Chrome trace). Pure.

The engine traces each tensor as a process: its negotiation
(``NEGOTIATE_<KIND>``: waiting until every rank submitted it), then the
collective, with its execution phases nested inside (``SHM_ALLREDUCE``,
``MPI_ALLREDUCE``, ``MEMCPY_IN_FUSION_BUFFER``, ...). Tensors fused together
share their phases' intervals, so time is the union of intervals per phase,
not their sum.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

NEGOTIATION = "NEGOTIATE"


def union_ms(intervals: Iterable[Tuple[float, float]]) -> float:
    """Milliseconds covered by (start, end) microsecond intervals, overlaps once.

    >>> union_ms([(0, 1000), (500, 1500), (3000, 4000)])
    2.5
    """
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total / 1000.0


def read_events(path: Path) -> List[dict]:
    """The events of a trace file, complete or cut off (a killed rank 0 leaves
    a file whose array is closed anyway; see ops/core/timeline.h)."""
    data = json.loads(Path(path).read_text())
    return data["traceEvents"] if isinstance(data, dict) else data


def phase_intervals(events: Iterable[dict]) -> Dict[str, List[Tuple[float, float]]]:
    """Phase name -> its (start, end) intervals in microseconds. Negotiations
    count under "NEGOTIATE"; a collective's own span under "collective" only
    where no nested phase covers it ("other execution")."""
    stacks: Dict[object, list] = {}
    phases: Dict[str, List[Tuple[float, float]]] = {}
    for e in events:
        ph = e.get("ph")
        if ph == "B":
            stacks.setdefault(e.get("pid"), []).append(e)
        elif ph == "E" and stacks.get(e.get("pid")):
            begin = stacks[e.get("pid")].pop()
            name = begin.get("name", "")
            if name.startswith(NEGOTIATION):
                name = NEGOTIATION
            elif not stacks[e.get("pid")]:
                name = "collective"  # the op's own span; its phases are nested in it
            phases.setdefault(name, []).append((float(begin["ts"]), float(e["ts"])))
    return phases


def phase_totals_ms(events: Iterable[dict]) -> Dict[str, float]:
    """Phase -> milliseconds (union over tensors), the largest first, with
    "other execution" for collective time outside every named phase."""
    phases = phase_intervals(events)
    spans = phases.pop("collective", [])
    totals = {name: union_ms(iv) for name, iv in phases.items()}
    named = [iv for name, ivs in phases.items() if name != NEGOTIATION for iv in ivs]
    other = union_ms(spans) - union_ms(named) if spans else 0.0
    if other > 0.0005:
        totals["other execution"] = other
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

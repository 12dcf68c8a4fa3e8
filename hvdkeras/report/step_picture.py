"""A picture of one training step's gradient reductions, from a timeline.

The engine's timeline (Chrome trace) has, for each collective, when this
rank submitted it (the start of ``NEGOTIATE_<KIND>``), when every rank had
(its end) and when it ran (the top-level event after it). A gradient bucket
is submitted the moment its last gradient is computed, so the span from the
first bucket's submission to the last's is the backward pass producing
gradients; a reduction drawn inside that span ran during the backward pass.
With cross-step updates (Note [cross-step updates] in
hvdkeras/training/cross_step.py) the timeline also holds, per bucket, when
the next step's forward pass reached it and when it got its result (a
``FRAMEWORK_WAIT`` span): a reduction that ends after the next forward pass
began ran while that pass did.
`step_reductions` reads one step's rows (pure); `draw_step` draws them.

What may import this module: examples and tools; it imports matplotlib
when drawing.
"""

from __future__ import annotations

import json
import re
from typing import Dict, List, Tuple

Row = Dict[str, float]


def _process_names(events: list) -> Dict[int, str]:
    """Each timeline row's (process's) tensor name."""
    return {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}


def _top_level(events: list, pattern: str) -> Dict[str, List[Tuple[str, float, float]]]:
    names = _process_names(events)
    stacks: Dict[int, list] = {}
    spans: Dict[str, List[Tuple[str, float, float]]] = {}
    for e in events:
        name = names.get(e.get("pid"), "")
        if not re.search(pattern, name):
            continue
        if e.get("ph") == "B":
            stacks.setdefault(e["pid"], []).append(e)
        elif e.get("ph") == "E" and stacks.get(e["pid"]):
            begin = stacks[e["pid"]].pop()
            if not stacks[e["pid"]]:
                spans.setdefault(name, []).append((begin["name"], begin["ts"], e["ts"]))
    return spans


def _waits(events: list, pattern: str) -> Dict[str, List[Tuple[float, float]]]:
    names = _process_names(events)
    waits: Dict[str, List[Tuple[float, float]]] = {}
    for e in events:
        name = names.get(e.get("pid"), "")
        if e.get("ph") == "X" and e.get("name") == "FRAMEWORK_WAIT" and re.search(pattern, name):
            waits.setdefault(name, []).append((e["ts"], e["ts"] + e["dur"]))
    return waits


def step_reductions(events: list, step: int = -2,
                    pattern: str = r"(?i)gradients(_bucket|_pending)?(_\d+)?$") -> List[Row]:
    """One step's gradient collectives, in milliseconds from the step's first
    submission. Pure.

    Args:
        events: A timeline's events (the parsed JSON list).
        step: Which step (Python indexing over the steps every collective
            has; the default, the second to last, avoids a partial last one).
        pattern: The collectives' names (DistributedOptimizer names them
            "<optimizer>_gradients", "_<group>", "_bucket_<bucket>" or, with
            cross-step updates, "_pending_<bucket>").

    Returns:
        One row per collective, ordered by submission: `name`, `submitted`,
        `agreed`, `start`, `end`; with cross-step updates also `reached`
        and `received` (when the next forward pass asked for the result
        and got it).

    Example:
        >>> e = [{"ph": "M", "name": "process_name", "pid": 1,
        ...       "args": {"name": "sgd_gradients_bucket_0"}},
        ...      {"ph": "B", "pid": 1, "ts": 1000, "name": "NEGOTIATE_ALLREDUCE"},
        ...      {"ph": "E", "pid": 1, "ts": 2000},
        ...      {"ph": "B", "pid": 1, "ts": 2000, "name": "ALLREDUCE"},
        ...      {"ph": "E", "pid": 1, "ts": 5000}]
        >>> step_reductions(e, step=0)[0]["end"]
        4.0
    """
    rows = []
    for name, spans in _top_level(events, pattern).items():
        negotiations = [s for s in spans if s[0].startswith("NEGOTIATE")]
        runs = [s for s in spans if not s[0].startswith("NEGOTIATE")]
        rows.append((name, negotiations, runs))
    steps = min((min(len(n), len(r)) for _, n, r in rows), default=0)
    if not steps:
        return []
    waits = _waits(events, pattern)
    index = step % steps if step < 0 else step
    picked = []
    for name, negotiations, runs in rows:
        _, submitted, agreed = negotiations[index]
        _, start, end = runs[index]
        row = {"name": name, "submitted": submitted, "agreed": agreed, "start": start, "end": end}
        # Each pending reduction has exactly one wait, after it started.
        if index < len(waits.get(name, [])):
            row["reached"], row["received"] = waits[name][index]
        picked.append(row)
    origin = min(r["submitted"] for r in picked)
    for r in picked:
        for key in ("submitted", "agreed", "start", "end", "reached", "received"):
            if key in r:
                r[key] = (r[key] - origin) / 1000.0
    return sorted(picked, key=lambda r: r["submitted"])


def draw_step(timeline_path: str, out_path: str, title: str, step: int = -2) -> List[Row]:
    """Draws `step_reductions` of a timeline file into a PNG.

    Args:
        timeline_path: The engine's timeline (rank 0's).
        out_path: Where the PNG goes.
        title: The picture's title.
        step: As in `step_reductions`.

    Returns:
        The rows drawn.

    Example:

    ```python
    draw_step("timeline.json", "step.png", "ResNet-50, 2 hosts, 1 Gbit/s")
    ```
    """
    import matplotlib  # lazy: drawing is optional
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: drawing is optional

    with open(timeline_path) as f:
        rows = step_reductions(json.load(f), step)
    if not rows:
        raise ValueError(f"{timeline_path} has no complete step of gradient reductions.")
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.6))
    last_ready = max(r["submitted"] for r in rows)
    # The spans sit behind the bars (zorder 0), whatever order they are drawn in.
    ax.axvspan(0, last_ready, color="#dde8f5", zorder=0,
               label="backward pass producing gradients")
    for y, r in enumerate(rows):
        ax.barh(y, r["start"] - r["submitted"], left=r["submitted"], height=0.3,
                color="#bbbbbb", label="waiting (peer not ready / engine busy)" if y == 0 else None)
        ax.barh(y, r["end"] - r["start"], left=r["start"], height=0.6, color="#d9822b",
                label="reduction on the link" if y == 0 else None)
    reached = [r["reached"] for r in rows if "reached" in r]
    if reached:
        ax.axvspan(min(reached), max(r.get("received", 0) for r in rows), color="#e3f1dc",
                   zorder=0, label="next step's forward pass reading the buckets")
        for y, r in enumerate(rows):
            if "reached" in r:
                ax.barh(y, max(r["received"] - r["reached"], 0.5), left=r["reached"],
                        height=0.15, color="#2a7a2a",
                        label="forward pass waiting for it" if y == 0 else None)
    ax.set_yticks(range(len(rows)), [r["name"].split("/")[-1] for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("ms from the step's first gradient bucket's submission (rank 0)")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return rows

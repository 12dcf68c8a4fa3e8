"""The report's pictures, drawn with matplotlib (a dependency of hvdkeras).

Each function draws one PNG into `path` and returns its caption, or returns
None (drawing nothing) when the run has no data for it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional

from hvdkeras.report.run_data import ENGINE_PREFIX, RunData

INSTALL_HINT = "pip install matplotlib  (hvdkeras installs it; this environment lost it)"


def _pyplot():
    try:
        import matplotlib  # lazy: seconds to import; only drawing needs it
    except ImportError as error:
        raise ImportError(f"hvdkeras report draws with matplotlib, which is not installed: "
                          f"{INSTALL_HINT}") from error
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt  # lazy: as above

    return plt


def _has(values: Optional[List[float]]) -> bool:
    return bool(values) and any(not math.isnan(v) for v in values)


def _epoch_axis(ax) -> None:
    from matplotlib.ticker import MaxNLocator  # lazy: with matplotlib

    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)


def curves(run: RunData, path: Path) -> Optional[str]:
    """Every training metric per epoch, with its validation curve."""
    names = [n for n in run.metric_names() if _has(run.history[n])]
    if not names:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(names), figsize=(4.8 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        ax.plot(run.epochs, run.history[name], marker="o", label="train")
        val = run.history.get("val_" + name)
        if _has(val):
            ax.plot(run.epochs, val, marker="s", label="validation")
        ax.set_title(name)
        _epoch_axis(ax)
        ax.grid(alpha=0.3)
        ax.legend()
    _save(fig, path)
    return "Training and validation metrics per epoch (averaged over the ranks)."


def learning_rate(run: RunData, path: Path) -> Optional[str]:
    values = run.history.get("learning_rate") or run.history.get("lr")
    if not _has(values):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot(run.epochs, values, marker="o", color="tab:purple")
    _epoch_axis(ax)
    ax.set_ylabel("learning rate")
    ax.set_title("Learning rate at the end of each epoch")
    ax.grid(alpha=0.3)
    _save(fig, path)
    return "The learning rate the optimizer held at the end of each epoch."


def throughput(run: RunData, path: Path) -> Optional[str]:
    values = run.history.get(ENGINE_PREFIX + "examples_per_second")
    if not _has(values):
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.bar(run.epochs, values, color="tab:green")
    _epoch_axis(ax)
    ax.set_ylabel("examples / s (all ranks)")
    ax.set_title("Training throughput per epoch")
    ax.grid(alpha=0.3, axis="y")
    _save(fig, path)
    return ("Training examples per second over all ranks, per epoch, from each epoch's "
            "second batch to its last (tracing and validation excluded).")


def step_time(run: RunData, path: Path) -> Optional[str]:
    """A step's time per epoch: the engine reducing, waiting, and the rest."""
    step = run.history.get(ENGINE_PREFIX + "step_ms")
    if not _has(step):
        return None
    nan = [math.nan] * len(step)
    reducing = run.history.get(ENGINE_PREFIX + "collective_ms_per_step", nan)
    waiting = run.history.get(ENGINE_PREFIX + "wait_ms_per_step", nan)
    clean = lambda xs: [0.0 if math.isnan(x) else x for x in xs]  # noqa: E731
    reducing, waiting = clean(reducing), clean(waiting)
    rest = [max(0.0, s - r - w) for s, r, w in zip(clean(step), reducing, waiting)]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.bar(run.epochs, rest, label="rest of the step (compute, input, framework)",
           color="tab:blue")
    ax.bar(run.epochs, reducing, bottom=rest, label="engine reducing", color="tab:orange")
    ax.bar(run.epochs, waiting, bottom=[a + b for a, b in zip(rest, reducing)],
           label="engine waiting for other ranks", color="tab:red")
    _epoch_axis(ax)
    ax.set_ylabel("ms per step (rank 0)")
    ax.set_title("Where a training step's time went")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    _save(fig, path)
    return ("Rank 0's mean step time per epoch, split into the time its engine spent reducing "
            "and waiting for the other ranks, and the rest. The engine works on its own "
            "thread, so where collectives overlap the backward pass the parts overlap too.")


def traffic(run: RunData, path: Path) -> Optional[str]:
    """MB reduced and gathered per step, per epoch; only for runs that gathered
    (the weights under `zero_stage=3`)."""
    gathered = run.history.get(ENGINE_PREFIX + "gathered_mb_per_step")
    if not _has(gathered):
        return None
    reduced = run.history.get(ENGINE_PREFIX + "reduced_mb_per_step", [math.nan] * len(gathered))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    width = 0.4
    ax.bar([e - width / 2 for e in run.epochs], reduced, width, label="reduced",
           color="tab:orange")
    ax.bar([e + width / 2 for e in run.epochs], gathered, width, label="gathered",
           color="tab:purple")
    _epoch_axis(ax)
    ax.set_ylabel("MB per step (rank 0)")
    ax.set_title("What the engine moved per step")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    _save(fig, path)
    return ("Megabytes rank 0's engine reduced (gradients) and gathered (every rank's part of "
            "the weights of zero_stage=3) per training step, per epoch.")


def timeline_phases(totals: Dict[str, float], path: Path, source: str) -> Optional[str]:
    """The engine's time by phase over a recorded timeline."""
    if not totals:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.8, 0.45 * len(totals) + 1.5))
    names, values = list(totals)[::-1], list(totals.values())[::-1]
    bars = ax.barh(names, values, color="tab:orange")
    ax.bar_label(bars, labels=[f"{v:.3g} ms" for v in values], padding=3, fontsize=8)
    ax.set_xlabel("ms over the whole trace")
    ax.set_xlim(0, max(values) * 1.25 or 1)
    ax.set_title("The engine's time by phase (rank 0's timeline)")
    ax.grid(alpha=0.3, axis="x")
    _save(fig, path)
    return (f"From {source}: the time rank 0's engine spent in each phase over the whole "
            "trace (training steps, the start-up broadcast and the metric averaging after "
            "each epoch's validation included). NEGOTIATE is waiting until every rank "
            "submitted a collective; the others are its execution.")

"""The few lines rank 0 prints at the end of a recipe run.

What may import this module: the rest of `hvdkeras.recipes` (pure Python).
"""

from __future__ import annotations

import os
from typing import Any, Dict

from hvdkeras.report.run_data import ENGINE_PREFIX




def _metric_line(values: Dict[str, float]) -> str:
    ordered = sorted(values, key=lambda k: (k.startswith("val_"), k != "loss", k))
    return "  ".join(f"{k} {values[k]:.4g}" for k in ordered
                     if k != "learning_rate" and not k.startswith(ENGINE_PREFIX))


def _engine_line(values: Dict[str, float]) -> str:
    """The last epoch's step and engine figures, in words; "" without them."""
    get = lambda name: values.get(ENGINE_PREFIX + name)  # noqa: E731
    if get("step_ms") is None:
        return ""
    buffers = get("batches_per_step") or 0
    gathered = get("gathered_mb_per_step")
    return (f"per step in the last epoch: {get('step_ms'):.1f} ms, of which the engine spent "
            f"{get('collective_ms_per_step'):.2f} ms reducing and "
            f"{get('wait_ms_per_step'):.2f} ms waiting for other ranks; "
            f"{get('reduced_mb_per_step'):.2f} MB reduced in {buffers:.3g} "
            f"buffer{'s' if buffers != 1 else ''}"
            + (f", {gathered:.2f} MB gathered" if gathered else ""))


def format_summary(s: Dict[str, Any]) -> str:
    """The few lines rank 0 prints at the end of a run."""
    lines = [f"===== {s['name']}: finished in {s['seconds']:.1f} s on {s['ranks']} "
             f"rank{'s' if s['ranks'] != 1 else ''} ====="]
    if s["epochs_run"]:
        first = s["initial_epoch"] + 1
        resumed = f" (resumed after epoch {s['initial_epoch']})" if s["initial_epoch"] else ""
        lines.append(f"trained epochs {first}-{s['last_epoch']} of {s['epochs']}{resumed}: "
                     f"{s['steps_per_epoch']} steps per epoch, global batch {s['global_batch']}, "
                     f"{s['fit_seconds']:.1f} s in fit")
    else:
        lines.append(f"nothing left to train: the checkpoint already holds epoch "
                     f"{s['initial_epoch']} of {s['epochs']} (raise training.epochs or remove "
                     f"{s['checkpoint_dir']} to start over)")
    if s["final"]:
        label = f"epoch {s['last_epoch']}" if s["epochs_run"] else "evaluated now"
        lines.append(f"final metrics ({label}): {_metric_line(s['final'])}")
    engine = _engine_line(s["final"]) if s["epochs_run"] else ""
    if engine:
        lines.append(engine)
    lr = s["final"].get("learning_rate")
    if lr is not None:
        lines.append(f"learning rate at the end: {lr:.4g}")
    if s["examples_per_second"]:
        lines.append(f"throughput: {s['examples_per_second']:.1f} examples/s over all ranks")
    if s["checkpoint_dir"]:
        newest = s["newest_checkpoint"] or "none written"
        lines.append(f"checkpoints: {s['checkpoint_dir']} (newest: {os.path.basename(newest)})")
    for key, label in (("csv_log", "history CSV"), ("tensorboard_dir", "TensorBoard logs"),
                       ("timeline", "engine timeline")):
        if s.get(key):
            lines.append(f"{label}: {s[key]}")
    return "\n".join(f"hvdkeras: {line}" for line in lines)

"""Draws docs/images/control_plane_scaling.png from docs/scaling_points.json.

    python scripts/plot_scaling.py [--points docs/scaling_points.json] [--out PNG]

The points file holds the JSON lines of examples/control_plane_benchmark.py,
real (`"mode": "real"`) and simulated (`"mode": "simulated"`) runs; the plot
puts both on the same axes against the rank count: rank 0's CPU time for the
first step and per steady step (the negotiation's own, in both modes), the
real runs' start-up, and the bytes rank 0 receives for the first step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import List

REPO_ROOT = Path(__file__).resolve().parent.parent


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=Path, default=REPO_ROOT / "docs" / "scaling_points.json")
    parser.add_argument("--out", type=Path,
                        default=REPO_ROOT / "docs" / "images" / "control_plane_scaling.png")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = json.loads(args.points.read_text())
    # Each panel: its title and the key per mode. Rank 0's CPU is the
    # negotiation's own in both modes (a real run's engine CPU also holds
    # MPI's work and the data collectives, which the stand-in does not run).
    panels = (("start-up, launch to the first collective (s)",
               {"real": "startup_s"}),
              ("rank 0 negotiation CPU, first step (s)",
               {"real": "first_step_rank0_negotiation_cpu_s",
                "simulated": "first_step_rank0_cpu_s"}),
              ("rank 0 negotiation CPU, steady step (µs)",
               {"real": "steady_step_rank0_negotiation_cpu_us",
                "simulated": "steady_step_rank0_cpu_us"}),
              ("bytes at rank 0, first step",
               {"real": "first_step_rank0_bytes_in", "simulated": "first_step_rank0_bytes_in"}))
    figure, axes = plt.subplots(1, len(panels), figsize=(18, 4.2))
    for axis, (title, keys) in zip(axes, panels):
        for mode, marker in (("real", "o"), ("simulated", "s")):
            key = keys.get(mode)
            chosen = sorted((p["ranks"], p[key]) for p in points
                            if key and p["mode"] == mode and p.get(key) is not None)
            if chosen:
                axis.plot(*zip(*chosen), marker=marker, label=mode)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("ranks")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend()
    figure.suptitle("hvdkeras control plane, 300 tensors a step (real: 2 cores, oversubscribed)")
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp.png")
    figure.savefig(tmp, dpi=110)
    tmp.replace(args.out)  # atomic: a reader never sees half a picture
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

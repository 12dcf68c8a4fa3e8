"""Training steps across the network-namespace lab's hosts: the synthetic
benchmark's lab mode, and the launcher the lab benchmarks share.

    sudo python scripts/netlab.py --name bench up --hosts 2
    python examples/synthetic_benchmark.py --lab bench --rates 1,2 \\
        --models ResNet50,MobileNetV2 --image-size 64 --batch-size 8 --peer

For each model, one rank on each of `--lab-hosts` hosts runs the synthetic
benchmark through `model.fit` with default settings: first on unshaped
links (the compute: the step when the link is not the limit), then with
every link shaped to each rate of `--rates` (Gbit/s, both directions). The
table gives the step against the link time of the gradients (each host's
link carries 2(H-1)/H of them out and as much in) and the ratio
step / max(compute, link time): 1.0 is a step where whichever is longer
hides the other completely. `--peer` adds PyTorch DDP (gloo) training a
ResNet-50 of the same layout (examples/ddp_peer.py) in the same lab, one
after the other, for the ResNet50 rows. Both frameworks use their default
threads. `--picture PATH` draws one step of the first rate's hvdkeras run
(hvdkeras/report/step_picture.py): the gradient buckets against the
backward pass.

What may import this module: the benchmarks in examples/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
NETLAB = os.path.join(REPO, "scripts", "netlab.py")


def lab_launcher(lab: str, hosts: str, n: int) -> list:
    """hvdkerasrun onto the network-namespace lab `lab` (scripts/netlab.py):
    `hosts` names hosts by index ("h0:1,h1:1")."""
    with open(f"/run/netlab-{lab}.json", encoding="utf-8") as f:
        state = json.load(f)
    names = [h["host"] for h in state["hosts"]]
    hosts = ",".join(f"{names[int(h[1:].split(':')[0])]}:{h.split(':')[1]}"
                     for h in hosts.split(","))
    ssh = f"{sys.executable} {NETLAB} --name {lab} ssh"
    return [os.path.join(os.path.dirname(sys.executable), "hvdkerasrun"), "-np", str(n),
            "-H", hosts, "--ssh-command", ssh, "--launcher-address", state["launcher"],
            "--network-interfaces", "eth0", "--no-prefix"]


def shape_links(lab: str, rate_gbit: float) -> None:
    """Every link of the lab at `rate_gbit` (0: unshaped)."""
    rate = "none" if not rate_gbit else f"{int(rate_gbit * 1000)}mbit"
    subprocess.run([sys.executable, NETLAB, "--name", lab, "rate", rate], check=True)


def link_ms(gradient_bytes: int, hosts: int, rate_gbit: float) -> float:
    """The least time one host's link needs for an allreduce of the gradients. Pure.

    >>> round(link_ms(102_000_000, 2, 1.0), 1)
    816.0
    """
    return 2 * (hosts - 1) / hosts * gradient_bytes * 8 / (rate_gbit * 1e9) * 1e3


def _result_line(cmd: list, env: Optional[dict] = None) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                         env=dict(os.environ, **(env or {})))
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} printed no result:\n{out.stdout[-3000:]}\n"
                       f"{out.stderr[-3000:]}")


def hvdkeras_step(lab: str, hosts: int, model: str, passthrough: List[str], work: str,
                  timeline: str = "") -> dict:
    """One job of the synthetic benchmark on the lab: its JSON result."""
    out = os.path.join(work, "result.json")
    launcher = lab_launcher(lab, ",".join(f"h{i}:1" for i in range(hosts)), hosts)
    cmd = [*launcher, sys.executable, os.path.join(HERE, "synthetic_benchmark.py"),
           *passthrough, "--model", model, "--json", out,
           *(["--timeline", timeline] if timeline else [])]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
    with open(out) as f:
        return json.load(f)


def ddp_step(lab: str, hosts: int, image_size: int, batch_size: int, steps: int) -> dict:
    """One job of the DDP peer on the lab: step_ms and gradient_bytes."""
    launcher = lab_launcher(lab, ",".join(f"h{i}:1" for i in range(hosts)), hosts)
    return _result_line([*launcher, sys.executable, os.path.join(HERE, "ddp_peer.py"),
                         "--image-size", str(image_size), "--batch-size", str(batch_size),
                         "--steps", str(steps), "--interface", "eth0"])


def _row(name: str, rate: float, step: float, compute: float, link: float) -> str:
    if not link:
        return f"| {name} | unshaped | {step:.0f} | - | - | - |"
    return (f"| {name} | {rate:g} Gbit/s | {step:.0f} | {compute:.0f} | {link:.0f} | "
            f"{step / max(compute, link):.2f} |")


def run_lab(args, passthrough: List[str]) -> None:
    """The lab mode's table (see the module's docstring)."""
    rates = [float(r) for r in args.rates.split(",") if r]
    models = (args.models or args.model).split(",")
    steps = args.num_batches_per_iter * args.num_iters
    lines = []
    with tempfile.TemporaryDirectory(prefix="lab-steps-") as work:
        for model in models:
            runs: Dict[str, Dict[float, float]] = {"hvdkeras": {}}
            peer = args.peer and model == "ResNet50"
            if peer:
                runs["DDP (gloo)"] = {}
            gradient_bytes = {}
            for rate in [0.0, *rates]:
                shape_links(args.lab, rate)
                timeline = (os.path.join(work, "timeline.json")
                            if args.picture and rate == rates[0] and model == models[0] else "")
                result = hvdkeras_step(args.lab, args.lab_hosts, model, passthrough, work,
                                       timeline)
                runs["hvdkeras"][rate] = result["step_ms"]
                gradient_bytes["hvdkeras"] = result["gradient_bytes"]
                if timeline:
                    _draw(timeline, args.picture, model, args, rate)
                if peer:
                    ddp = ddp_step(args.lab, args.lab_hosts, args.image_size, args.batch_size,
                                   steps)
                    runs["DDP (gloo)"][rate] = ddp["step_ms"]
                    gradient_bytes["DDP (gloo)"] = ddp["gradient_bytes"]
                print(f"{model} at {rate or 'unshaped'}: "
                      + ", ".join(f"{k} {v[rate]:.0f} ms" for k, v in runs.items()), flush=True)
            for name, by_rate in runs.items():
                label = f"{model}, {name} ({gradient_bytes[name] / 2**20:.1f} MiB)"
                lines.append(_row(label, 0, by_rate[0.0], 0, 0))
                for rate in rates:
                    lines.append(_row(label, rate, by_rate[rate], by_rate[0.0],
                                      link_ms(gradient_bytes[name], args.lab_hosts, rate)))
    shape_links(args.lab, 0)
    print(f"\n{args.lab_hosts} hosts x 1 rank, {args.image_size}px, batch {args.batch_size} "
          f"per rank; mean step of {steps} after {args.num_warmup_batches} warm-up steps")
    print("| model, framework (gradients) | link | step ms | compute ms (unshaped step) | "
          "link time ms | step / max(compute, link) |")
    print("|---|---|---|---|---|---|")
    for line in lines:
        print(line)


def _draw(timeline: str, picture: str, model: str, args, rate: float) -> None:
    sys.path.insert(0, REPO)  # deliberate: run as a script, the repository may not be installed
    from hvdkeras.report.step_picture import draw_step  # lazy: matplotlib, only for pictures

    draw_step(timeline, picture, f"{model} {args.image_size}px batch {args.batch_size}, "
              f"{args.lab_hosts} hosts x 1 rank, {rate:g} Gbit/s: one step (rank 0)")
    print(f"picture of one step: {picture}", flush=True)

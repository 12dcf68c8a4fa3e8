"""Hierarchical against flat allreduce, on hosts simulated on this machine.

Run it directly (it starts its own MPI jobs):

    python examples/hierarchical_benchmark.py

For each layout (2 hosts x 1 rank, 2 hosts x 2 ranks) it runs the same job
with `HVDKERAS_HIERARCHICAL_ALLREDUCE=0` (one MPI allreduce over all ranks)
and `=1` (shared memory within a host, MPI across hosts; see Note
[hierarchical allreduce] in ops/core/allreduce_path.h), alternating, and
prints the median time of one allreduce of a single float32 tensor per size
and the ratio flat / hierarchical (above 1: the hierarchical way is faster).

The hosts are simulated with MPICH's fork launcher and a host list (`mpiexec
-launcher fork -hosts a:2,b:2`): MPI then treats the two groups as separate
nodes, so `local_rank`, `cross_rank` and the shared-memory domains are what
they would be on two machines, and traffic between the groups goes through
MPI's network module. On one machine that "network" is still memory, so
`--transport tcp` (UCX over TCP loopback) is the closer stand-in for a real
network; the default leaves MPI's choice.

On hosts of their own (`scripts/netlab.py up --hosts 3 --rate 1gbit`, as
root), `--lab hvk --rate-gbit 1` launches through `hvdkerasrun` with the
lab's ssh stand-in, so the ranks of different hosts share no memory and
their traffic crosses the shaped links; the table then adds the bus
bandwidth of each path as a percentage of the link's limit (a host's one
link must carry 2(H-1)/H of the tensor out and as much in, for H hosts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIZES = {"4MB": 4 << 20, "64MB": 64 << 20, "256MB": 256 << 20}
LAYOUTS = {"2x1": "h0:1,h1:1", "2x2": "h0:2,h1:2", "3x1": "h0:1,h1:1,h2:1",
           "3x2": "h0:2,h1:2,h2:2"}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(sizes: list, iterations: int) -> None:
    """Inside the MPI job: rank 0 prints one JSON line of median ms per size."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    import hvdkeras as hvd

    hvd.init()
    results = {"path": hvd.engine_config().hierarchical_allreduce}
    for name in sizes:
        x = tf.constant(np.full(SIZES[name] // 4, hvd.rank() + 1, np.float32))
        expected = hvd.size() * (hvd.size() + 1) / 2
        step = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))
        assert float(step(x)[0]) == expected  # and warm
        times = []
        for _ in range(iterations):
            hvd.barrier()
            start = time.perf_counter()
            step(x).numpy()
            times.append(time.perf_counter() - start)
        slowest = hvd.allgather_object(statistics.median(times))
        results[name] = max(slowest) * 1e3
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    hvd.shutdown()


def lab_launcher(lab: str, hosts: str, n: int) -> list:
    """hvdkerasrun onto the network-namespace lab `lab` (scripts/netlab.py)."""
    with open(f"/run/netlab-{lab}.json", encoding="utf-8") as f:
        state = json.load(f)
    names = [h["host"] for h in state["hosts"]]
    hosts = ",".join(f"{names[int(h[1:].split(':')[0])]}:{h.split(':')[1]}"
                     for h in hosts.split(","))
    ssh = f"{sys.executable} {os.path.join(REPO, 'scripts', 'netlab.py')} --name {lab} ssh"
    return [os.path.join(os.path.dirname(sys.executable), "hvdkerasrun"), "-np", str(n),
            "-H", hosts, "--ssh-command", ssh, "--launcher-address", state["launcher"],
            "--network-interfaces", "eth0", "--no-prefix"]


def link_limit_ms(size: int, layout: str, rate_gbit: float) -> float:
    """The least time an allreduce of `size` bytes can take when each host
    has one link of `rate_gbit` (full duplex). Pure."""
    hosts = len(LAYOUTS[layout].split(","))
    return 2 * (hosts - 1) / hosts * size * 8 / (rate_gbit * 1e9) * 1e3


def run_job(layout: str, hierarchical: bool, sizes: list, iterations: int,
            transport: str, lab: str = "") -> dict:
    hosts = LAYOUTS[layout]
    n = sum(int(h.split(":")[1]) for h in hosts.split(","))
    env = dict(os.environ, HVDKERAS_HIERARCHICAL_ALLREDUCE="1" if hierarchical else "0")
    if transport == "tcp":
        env["UCX_TLS"] = "tcp,self"
    launcher = lab_launcher(lab, hosts, n) if lab else [
        "mpiexec", "-launcher", "fork", "-hosts", hosts, "-n", str(n)]
    cmd = [*launcher, sys.executable,
           os.path.abspath(__file__), "--worker", "--sizes", ",".join(sizes),
           "--iterations", str(iterations)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} printed no result:\n{out.stdout}\n{out.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="4MB,64MB", help=f"of {', '.join(SIZES)}")
    parser.add_argument("--layouts", default="2x1,2x2", help=f"of {', '.join(LAYOUTS)}")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3,
                        help="alternating flat/hierarchical job pairs per layout")
    parser.add_argument("--transport", choices=("default", "tcp"), default="default")
    parser.add_argument("--lab", default="", help="run on this network-namespace lab's hosts")
    parser.add_argument("--rate-gbit", type=float, default=0.0,
                        help="the lab's link rate, for the percentage of the link's limit")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    if args.worker:
        worker(sizes, args.iterations)
        return
    where = f"lab {args.lab} hosts" if args.lab else f"simulated hosts ({args.transport})"
    print(f"between {where}; median ms of one allreduce, median over {args.repeat} "
          "alternating job pairs" + (f"; links {args.rate_gbit:g} Gbit/s" if args.rate_gbit else ""))
    limit_columns = f"  {'limit ms':>8}  {'flat %':>6}  {'hier %':>6}" if args.rate_gbit else ""
    print(f"{'layout':>6}  {'size':>5}  {'flat ms':>8}  {'hier ms':>8}  {'flat/hier':>9}"
          + limit_columns)
    for layout in args.layouts.split(","):
        runs = {False: [], True: []}
        for _ in range(args.repeat):
            for hierarchical in (False, True):
                result = run_job(layout, hierarchical, sizes, args.iterations, args.transport,
                                 args.lab)
                assert result["path"] == ("on" if hierarchical else "off"), result
                runs[hierarchical].append(result)
        for name in sizes:
            flat = statistics.median(r[name] for r in runs[False])
            hier = statistics.median(r[name] for r in runs[True])
            line = f"{layout:>6}  {name:>5}  {flat:8.2f}  {hier:8.2f}  {flat / hier:9.2f}"
            if args.rate_gbit:
                limit = link_limit_ms(SIZES[name], layout, args.rate_gbit)
                line += f"  {limit:8.1f}  {100 * limit / flat:6.0f}  {100 * limit / hier:6.0f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()

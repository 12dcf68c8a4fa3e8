"""Allreduce across hosts: hvdkeras's paths against raw MPI and torch's gloo.

Run it directly (it starts its own MPI jobs):

    python examples/hierarchical_benchmark.py

Each job times one allreduce of a single float32 tensor per size (median of
`--iterations` after two warm-ups, the slowest rank's) through one path:

- `hvdkeras`: default settings (what `auto` chooses for the layout);
- `flat`: `HVDKERAS_HIERARCHICAL_ALLREDUCE=0` (one exchange over all ranks:
  the ring of Note [ring across hosts] in ops/core/ring_plan.h where the
  ranks span hosts, else MPI's own);
- `hier`: `HVDKERAS_HIERARCHICAL_ALLREDUCE=1` (shared memory within a host,
  across hosts one rank per host and slice; Note [hierarchical allreduce]);
- `mpi-only`: hvdkeras with `HVDKERAS_RING_COLLECTIVES=0` (MPI's own
  algorithms between hosts, as before the ring);
- `fp16`, `bf16`: hvdkeras's default path with the tensor cast to 16 bits
  on the wire (`compression=hvd.Compression.fp16` / `.bf16`: half the bytes,
  at the cost of the sums' precision);
- `mpi`: raw mpi4py `Allreduce` on NumPy arrays, through the MPI hvdkeras
  ships (no hvdkeras, no TensorFlow);
- `gloo`: `torch.distributed.all_reduce` with the gloo backend (what
  PyTorch DDP uses on CPUs), one thread per rank.

The jobs of a layout run one after the other, `--repeat` rounds, and the
table has the median over rounds.

By default the hosts are simulated with MPICH's fork launcher and a host
list (`mpiexec -launcher fork -hosts a:2,b:2`): MPI treats the groups as
separate nodes, but their "network" is memory (`--transport tcp` puts UCX
on TCP loopback). On hosts of their own (`scripts/netlab.py up --hosts 4
--rate 1gbit`, as root), `--lab NAME --rate-gbit 1` launches through
`hvdkerasrun` with the lab's ssh stand-in: the ranks of different hosts
share no memory and their traffic crosses the shaped links, and the table
adds each path's time as a percentage of the link's limit (each host's one
link must carry 2(H-1)/H of the tensor out and as much in, for H hosts):

    python examples/hierarchical_benchmark.py --lab bench --rate-gbit 1 \\
        --layouts 2x1,3x1,4x1,3x2 --sizes 64MB,256MB --paths hvdkeras,mpi,gloo
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

from lab_steps import lab_launcher

SIZES = {"4MB": 4 << 20, "16MB": 16 << 20, "64MB": 64 << 20, "256MB": 256 << 20}
LAYOUTS = {"2x1": "h0:1,h1:1", "2x2": "h0:2,h1:2", "3x1": "h0:1,h1:1,h2:1",
           "3x2": "h0:2,h1:2,h2:2", "4x1": "h0:1,h1:1,h2:1,h3:1",
           "5x1": "h0:1,h1:1,h2:1,h3:1,h4:1"}
# Path -> the hvdkeras settings its job runs with (None: not hvdkeras).
PATHS = {
    "hvdkeras": {},
    "flat": {"HVDKERAS_HIERARCHICAL_ALLREDUCE": "0"},
    "hier": {"HVDKERAS_HIERARCHICAL_ALLREDUCE": "1"},
    "mpi-only": {"HVDKERAS_RING_COLLECTIVES": "0"},
    "fp16": {},
    "bf16": {},
    "mpi": None,
    "gloo": None,
}
GLOO_PORT = 29517


def timed(run_once, barrier, iterations: int) -> float:
    """Median seconds of `run_once` over `iterations`, after two warm-ups."""
    for _ in range(2):
        run_once()
    times = []
    for _ in range(iterations):
        barrier()
        start = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hvdkeras_worker(sizes: list, iterations: int, path: str) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np  # lazy: the worker's framework
    import tensorflow as tf  # lazy: the worker's framework

    import hvdkeras as hvd

    hvd.init()
    results = {"setting": hvd.engine_config().hierarchical_allreduce}
    compression = getattr(hvd.Compression, path, hvd.Compression.none)
    step = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum, compression=compression))
    for name in sizes:
        x = tf.constant(np.full(SIZES[name] // 4, hvd.rank() + 1, np.float32))
        assert float(step(x)[0]) == hvd.size() * (hvd.size() + 1) / 2
        median = timed(lambda: step(x).numpy(), hvd.barrier, iterations)
        results[name] = max(hvd.allgather_object(median)) * 1e3
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(results), flush=True)
    hvd.shutdown()
    return results


def mpi_worker(sizes: list, iterations: int) -> None:
    import numpy as np  # lazy: the worker's framework
    from mpi4py import MPI  # lazy: importing it starts MPI

    comm = MPI.COMM_WORLD
    results = {}
    for name in sizes:
        x = np.full(SIZES[name] // 4, comm.rank + 1, np.float32)
        y = np.empty_like(x)
        comm.Allreduce(x, y)
        assert y[0] == comm.size * (comm.size + 1) / 2
        median = timed(lambda: comm.Allreduce(x, y), comm.Barrier, iterations)
        results[name] = max(comm.allgather(median)) * 1e3
    if comm.rank == 0:
        print("RESULT " + json.dumps(results), flush=True)


def gloo_worker(sizes: list, iterations: int, interface: str) -> None:
    from mpi4py import MPI  # lazy: importing it starts MPI
    import torch  # lazy: the peer's framework
    import torch.distributed as dist  # lazy: the peer's framework

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    address = comm.bcast(socket.gethostbyname(socket.gethostname()), root=0)
    if interface:
        os.environ["GLOO_SOCKET_IFNAME"] = interface
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{GLOO_PORT}",
                            rank=comm.rank, world_size=comm.size)
    results = {}
    for name in sizes:
        x = torch.full((SIZES[name] // 4,), float(comm.rank + 1))
        y = x.clone()
        dist.all_reduce(y)
        assert float(y[0]) == comm.size * (comm.size + 1) / 2
        median = timed(lambda: dist.all_reduce(x), dist.barrier, iterations)
        results[name] = max(comm.allgather(median)) * 1e3
    if comm.rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def link_limit_ms(size: int, layout: str, rate_gbit: float) -> float:
    """The least time an allreduce of `size` bytes can take when each host
    has one link of `rate_gbit` (full duplex). Pure.

    >>> round(link_limit_ms(64 << 20, "3x1", 1.0), 1)
    715.8
    """
    hosts = len(LAYOUTS[layout].split(","))
    return 2 * (hosts - 1) / hosts * size * 8 / (rate_gbit * 1e9) * 1e3


def run_job(layout: str, path: str, sizes: list, iterations: int, transport: str,
            lab: str = "") -> dict:
    hosts = LAYOUTS[layout]
    n = sum(int(h.split(":")[1]) for h in hosts.split(","))
    env = dict(os.environ, **(PATHS[path] or {}))
    if transport == "tcp":
        env["UCX_TLS"] = "tcp,self"
    launcher = lab_launcher(lab, hosts, n) if lab else [
        os.path.join(os.path.dirname(sys.executable), "mpiexec"), "-launcher", "fork",
        "-hosts", hosts, "-n", str(n)]
    cmd = [*launcher, sys.executable, os.path.abspath(__file__), "--worker", path,
           "--sizes", ",".join(sizes), "--iterations", str(iterations)]
    if lab:
        cmd += ["--interface", "eth0"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{' '.join(cmd)} printed no result:\n{out.stdout}\n{out.stderr}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", choices=tuple(PATHS), help=argparse.SUPPRESS)
    parser.add_argument("--interface", default="", help=argparse.SUPPRESS)
    parser.add_argument("--sizes", default="4MB,64MB", help=f"of {', '.join(SIZES)}")
    parser.add_argument("--layouts", default="2x1,2x2", help=f"of {', '.join(LAYOUTS)}")
    parser.add_argument("--paths", default="flat,hier", help=f"of {', '.join(PATHS)}")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of jobs per layout")
    parser.add_argument("--transport", choices=("default", "tcp"), default="default")
    parser.add_argument("--lab", default="", help="run on this network-namespace lab's hosts")
    parser.add_argument("--rate-gbit", type=float, default=0.0,
                        help="the lab's link rate, for the percentage of the link's limit")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    if args.worker == "mpi":
        mpi_worker(sizes, args.iterations)
        return
    if args.worker == "gloo":
        gloo_worker(sizes, args.iterations, args.interface)
        return
    if args.worker:
        hvdkeras_worker(sizes, args.iterations, args.worker)
        return
    paths = args.paths.split(",")
    where = f"lab {args.lab} hosts" if args.lab else f"simulated hosts ({args.transport})"
    print(f"between {where}; median ms of one float32 allreduce (slowest rank), median "
          f"over {args.repeat} rounds" + (f"; links {args.rate_gbit:g} Gbit/s, % of the "
                                          "link's limit in brackets" if args.rate_gbit else ""))
    print(f"{'layout':>6}  {'size':>5}" + (f"  {'limit':>7}" if args.rate_gbit else "")
          + "".join(f"  {p:>15}" for p in paths))
    for layout in args.layouts.split(","):
        runs = {p: [] for p in paths}
        for _ in range(args.repeat):
            for path in paths:
                runs[path].append(run_job(layout, path, sizes, args.iterations, args.transport,
                                          args.lab))
        for name in sizes:
            line = f"{layout:>6}  {name:>5}"
            limit = link_limit_ms(SIZES[name], layout, args.rate_gbit) if args.rate_gbit else 0
            if limit:
                line += f"  {limit:7.1f}"
            for path in paths:
                ms = statistics.median(r[name] for r in runs[path])
                share = f" ({100 * limit / ms:3.0f}%)" if limit else ""
                line += f"  {ms:9.1f}{share:>6}" if limit else f"  {ms:15.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()

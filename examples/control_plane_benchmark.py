"""What the control plane costs at many ranks: start-up, the first step and the
steady negotiation cycle, measured on real MPI processes beside raw MPI, or
simulated for many more ranks than this machine can start.

    python examples/control_plane_benchmark.py --real --ranks 64 --tensors 300 --json
    python examples/control_plane_benchmark.py --simulate --ranks 16384 --tensors 300 --json

--simulate runs the control plane's stand-in (ops/core/virtual_ranks.h):
`--ranks` virtual ranks as threads of this one process, each running the
real negotiation (coordinator, response cache, digests) over an in-memory
transport, with some ranks a cycle late (`--stragglers`) and each rank
submitting in its own order, rank 0's thread on a core of its own (as a
real rank 0 has) and, by default, its caches cold at the start of each
cycle, at every size alike (`--rank0-caches`; Note [a cold rank 0] in
ops/core/virtual_ranks.cc).
It prints rank 0's CPU time in the negotiation
(the first step; the median steady cycle and step), the bytes rank 0 receives, its counted peak
memory for the negotiation, the liveness sockets the tree plan gives rank 0,
and the wall time the exchanges would add on a link of `--latency-us` and
`--gbps` (by default both measured here with raw mpi4py between 2 ranks).

--real starts `--ranks` framework-free MPI processes (the engine library through
ctypes, NumPy buffers; no Keras, TensorFlow, JAX or torch, so about 60 MiB
each) on this machine, oversubscribed. Every rank submits `--tensors`
single-float allreduces a step, all at once as a backward pass hands over
its gradients, waits for them, and checks every result exactly against what
each rank contributed. Step 1 is negotiated through rank 0 (new names);
the later steps should be answered from the response cache by one small
bit-vector allreduce per cycle. With `--framework jax` (or torch) every rank
is a framework rank instead: Keras on that backend imported (its time is
library_load_s), the engine started by hvdkeras.init() and the first
collective made through the backend's own allreduce; the steps submit to
the same engine as above.

It prints (one JSON object with `--json`):
  startup_s: launch to the first collective done on every rank, split into
    mpi_init_s (the interpreter and MPI_Init), engine_start_s (the engine's
    topology, shared memory and liveness set-up) and first_collective_s;
  first_step_rank0_cpu_s / first_step_s: the CPU time of rank 0's engine
    (its threads other than Python's) and the wall time of the negotiated
    first step; first_step_rank0_bytes_in: the requests' bytes rank 0
    received for it (digests, and the requests it lacked in full);
  steady_cycle_us / steady_cycle_rank0_cpu_us: wall time and rank 0's
    engine CPU time per negotiation cycle over the steady steps (the wall
    time includes Python submitting the requests one by one);
  steady_tail_us / mpi_tail_floor_us: from the last rank's last submission
    to the last result (what the control plane adds to a step after its
    backward pass), beside one bit-vector allreduce and the step's data
    allreduce through mpi4py;
  mpi_floor_us: raw mpi4py doing one cycle's collectives in the same job
    (the bit-vector allreduce of the same length, and the step's fused data
    allreduce spread over its cycles): what no control plane can undercut;
  first_step_rank0_negotiation_cpu_s / steady_step_rank0_negotiation_cpu_us:
    rank 0's CPU inside the negotiation alone, outside its exchanges (what
    the stand-in counts too), for the first step and for the median steady
    step;
  predicted / real_over_predicted: the stand-in run for the same ranks,
    tensors and steps, its figures for those two and the first step's bytes,
    and the real figure over the predicted one, rank 0's caches modelled as
    predicted_rank0_caches says (private where the real steady cycle took
    under 10 ms, cold from there: other ranks' processes ran between rank
    0's cycles); steady_step_real_over_predicted_by_caches: the steady
    step's ratio under each model;
  cached_fraction: the share of the steady steps' collectives agreed by
    their cache bit alone; cache_evictions; rank0_peak_mib (peak resident
    memory of rank 0); rank0_liveness_sockets; exact.

With more ranks than cores the wall times measure the oversubscription too;
the ratios to the MPI floor taken in the same run, the CPU times and the
counts are what carry over to a real cluster (docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from control_plane_standin import (CACHE_MODELS, predict_real,  # noqa: E402
                                   run_simulated)

RANK_FLAG = "--rank-program"
LINK_FLAG = "--link-program"
LAUNCHED_AT = "HVDKERAS_BENCH_LAUNCHED_AT"


def _rank_program(tensors: int, steps: int, framework: str) -> None:
    """One rank of the real run; rank 0 prints the JSON line."""
    launched = float(os.environ[LAUNCHED_AT])
    from mpi4py import MPI
    import numpy as np

    from hvdkeras.engine import c_api, library, requests, types
    from hvdkeras.engine.config import engine_config_from_env

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mpi_ready = time.time()
    config = engine_config_from_env()
    if framework:
        # A framework rank: Keras on that backend and hvdkeras.init() start
        # the engine, and the first collective goes through the backend's own
        # allreduce; the steps below submit to the same engine.
        os.environ["KERAS_BACKEND"] = framework
        import keras
        import hvdkeras as hvd

        loaded = time.time()
        comm.Barrier()
        engine_begin = time.time()
        hvd.init()
        engine_ready = time.time()
        lib = library.engine_handle()
    else:
        lib = library.engine_handle()
        loaded = time.time()
        engine_comm = comm.Dup()
        comm.Barrier()
        engine_begin = time.time()
        c_api.start(lib, engine_comm.py2f(), config)
        engine_ready = time.time()
    bound = config.stall_shutdown_seconds + 60.0
    dtype = next(d.value for d in library.vocabulary().dtypes if d.name == "float32")
    sum_op = types.Sum
    expected = np.float32(size * (size + 1) / 2)
    exact = True

    def step(label: str) -> tuple:
        """Returns when this rank had submitted the step's last tensor and
        when it had every result."""
        nonlocal exact
        inputs = [np.full(1, rank + 1, np.float32) for _ in range(tensors)]
        outputs = [np.empty(1, np.float32) for _ in range(tensors)]
        pending = [requests.submit(requests.ALLREDUCE, f"{label}.{i}",
                                   [requests.Buffer(a.ctypes.data, a.shape)],
                                   [o.ctypes.data], dtype, op=sum_op, keep=(a, o))
                   for i, (a, o) in enumerate(zip(inputs, outputs))]
        submitted = time.time()
        for p in pending:
            p.wait(bound).release()
        done = time.time()
        exact = exact and all(o[0] == expected for o in outputs)
        return submitted, done

    def engine_cpu() -> float:
        """CPU time of this process's threads other than this one: the
        engine's and the watchdog's."""
        return time.process_time() - time.thread_time()

    if framework:
        total = hvd.allreduce(keras.ops.ones((1,)), name="startup", op=hvd.Sum)
        exact = float(keras.ops.convert_to_numpy(total)[0]) == size
    else:
        one = np.ones(1, np.float32)
        requests.submit(requests.ALLREDUCE, "startup", [requests.Buffer(one.ctypes.data, (1,))],
                        [one.ctypes.data], dtype, op=sum_op, keep=one).wait(bound).release()
    first_done = comm.allreduce(time.time(), op=MPI.MAX)
    started = {"mpi_init_s": comm.allreduce(mpi_ready - launched, op=MPI.MAX),
               "library_load_s": comm.allreduce(loaded - mpi_ready, op=MPI.MAX),
               "engine_start_s": comm.allreduce(engine_ready - engine_begin, op=MPI.MAX),
               "first_collective_s": first_done - comm.allreduce(engine_ready, op=MPI.MAX),
               "startup_s": first_done - launched}

    comm.Barrier()
    stats0 = c_api.negotiation_stats(lib)
    cpu0, wall0 = engine_cpu(), time.perf_counter()
    step("grad")  # new names: negotiated at rank 0
    first_cpu, first_wall = engine_cpu() - cpu0, time.perf_counter() - wall0
    first_wall = comm.allreduce(first_wall, op=MPI.MAX)
    before = c_api.negotiation_stats(lib)
    first_bytes_in = before[4] - stats0[4]
    first_negotiation_cpu = (before[5] - stats0[5]) * 1e-9
    comm.Barrier()
    cpu0, wall0 = engine_cpu(), time.perf_counter()
    marks, step_negotiation_ns = [], []
    for _ in range(steps):
        counted = c_api.negotiation_stats(lib)[5]
        marks.append(step("grad"))
        step_negotiation_ns.append(c_api.negotiation_stats(lib)[5] - counted)
    steady_cpu, steady_wall = engine_cpu() - cpu0, time.perf_counter() - wall0
    steady_wall = comm.allreduce(steady_wall, op=MPI.MAX)
    # The tail: from the last rank's last submission to the last rank's last
    # result, the part of a step the control plane adds after the backward pass.
    last_submitted = np.array([m[0] for m in marks])
    last_done = np.array([m[1] for m in marks])
    comm.Allreduce(MPI.IN_PLACE, last_submitted, op=MPI.MAX)
    comm.Allreduce(MPI.IN_PLACE, last_done, op=MPI.MAX)
    tail = float(np.median(last_done - last_submitted))
    after = c_api.negotiation_stats(lib)
    cycles, cached, negotiated = (after[i] - before[i] for i in range(3))
    # The typical step, as the stand-in reports it: a preempted step on these
    # shared cores can take several times the others.
    steady_negotiation_cpu = float(np.median(step_negotiation_ns)) * 1e-9
    cycles = max(comm.allreduce(cycles, op=MPI.MAX), 1)

    # The floor: the same cycles' collectives through mpi4py alone. The
    # engine's vector: a status word, then hit and valid bits for each cache
    # entry (the step's tensors and "startup").
    words = 1 + 2 * ((tensors + 1 + 63) // 64)
    bits = np.full(words, ~np.uint64(0), np.uint64)
    data = np.full(tensors, rank + 1, np.float32)
    comm.Barrier()
    wall0 = time.perf_counter()
    for _ in range(steps):
        for _ in range(cycles // steps):
            comm.Allreduce(MPI.IN_PLACE, bits, op=MPI.BAND)
        comm.Allreduce(MPI.IN_PLACE, data.copy(), op=MPI.SUM)
    floor_wall = comm.allreduce(time.perf_counter() - wall0, op=MPI.MAX)
    # The tail's floor: one bit-vector allreduce and the step's data.
    comm.Barrier()
    wall0 = time.perf_counter()
    for _ in range(steps):
        comm.Allreduce(MPI.IN_PLACE, bits, op=MPI.BAND)
        comm.Allreduce(MPI.IN_PLACE, data.copy(), op=MPI.SUM)
    tail_floor = comm.allreduce(time.perf_counter() - wall0, op=MPI.MAX) / steps

    exact = comm.allreduce(exact, op=MPI.LAND)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sockets = c_api.liveness_sockets(lib)
    if framework:
        hvd.shutdown()
    else:
        lib.hvdkeras_engine_stop()
    if rank == 0:
        print(json.dumps({
            "ranks": size, "tensors": tensors, "steps": steps, "exact": bool(exact),
            "framework": framework or None,
            **{k: round(v, 4) for k, v in started.items()},
            "first_step_s": round(first_wall, 4),
            "first_step_rank0_cpu_s": round(first_cpu, 4),
            "first_step_rank0_bytes_in": int(first_bytes_in),
            "first_step_rank0_negotiation_cpu_s": round(first_negotiation_cpu, 5),
            "steady_cycles_per_step": round(cycles / steps, 2),
            "steady_cycle_us": round(steady_wall / cycles * 1e6, 1),
            "steady_cycle_rank0_cpu_us": round(steady_cpu / cycles * 1e6, 1),
            "steady_step_rank0_negotiation_cpu_us": round(steady_negotiation_cpu * 1e6, 1),
            "mpi_floor_us": round(floor_wall / cycles * 1e6, 1),
            "steady_tail_us": round(tail * 1e6, 1),
            "mpi_tail_floor_us": round(tail_floor * 1e6, 1),
            "cached_fraction": round(cached / max(cached + negotiated, 1), 4),
            "cache_evictions": after[3],
            "rank0_peak_mib": round(peak, 1),
            "rank0_liveness_sockets": sockets,
        }), flush=True)


def run_real(ranks: int, tensors: int, steps: int, extra_env: Dict[str, str],
             timeout: float, lab: str = "", lab_hosts: int = 0, framework: str = "") -> dict:
    """Launches the real run and returns rank 0's figures: on this machine, or
    with `lab` over the first `lab_hosts` hosts of that network-namespace lab
    (scripts/netlab.py), `ranks / lab_hosts` on each."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    # The step's data is a few KiB: a small shared-memory arena per rank
    # (64 MiB by default, reserved in memory) lets 256 ranks fit one host's
    # memory without changing what the control plane does.
    env = {"HVDKERAS_SHM_ARENA_BYTES": str(4 << 20), **os.environ, **extra_env,
           LAUNCHED_AT: repr(time.time())}
    if lab:
        from lab_steps import lab_launcher

        if lab_hosts < 1 or ranks % lab_hosts:
            raise SystemExit(f"--ranks {ranks} must be a multiple of --lab-hosts {lab_hosts}")
        hosts = ",".join(f"h{i}:{ranks // lab_hosts}" for i in range(lab_hosts))
        launcher = lab_launcher(lab, hosts, ranks)
    else:
        launcher = [str(mpiexec), "-n", str(ranks)]
    cmd = [*launcher, sys.executable, __file__, RANK_FLAG, str(tensors), str(steps),
           *([framework] if framework else [])]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the {ranks}-rank run failed (exit {done.returncode}):\n"
                           f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    result = json.loads(lines[-1])
    result["stderr"] = done.stderr
    return result


def _link_program() -> None:
    """Two ranks' ping-pong: rank 0 prints the latency and bandwidth seen."""
    from mpi4py import MPI
    import numpy as np

    comm = MPI.COMM_WORLD
    peer = 1 - comm.Get_rank()
    result = {}
    for label, nbytes, reps in (("latency_s", 8, 2000), ("big_s", 4 << 20, 20)):
        buf = np.zeros(nbytes, np.uint8)
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            if comm.Get_rank() == 0:
                comm.Send(buf, dest=peer)
                comm.Recv(buf, source=peer)
            else:
                comm.Recv(buf, source=peer)
                comm.Send(buf, dest=peer)
        result[label] = (time.perf_counter() - t0) / (2 * reps)
    if comm.Get_rank() == 0:
        print(json.dumps({"latency_s": result["latency_s"],
                          "bytes_per_s": (4 << 20) / max(result["big_s"] - result["latency_s"],
                                                         1e-9)}), flush=True)


def measure_link(timeout: float = 120.0):
    """The link's constants on this machine, from raw mpi4py between 2 ranks."""
    from hvdkeras.engine.control_plane_model import Link

    mpiexec = Path(sys.executable).parent / "mpiexec"
    done = subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, LINK_FLAG],
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"measuring the link failed (exit {done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    measured = json.loads(lines[-1])
    return Link(measured["latency_s"], measured["bytes_per_s"],
                "measured here: raw mpi4py ping-pong between 2 ranks")


def main(argv: List[str]) -> int:
    if argv[:1] == [RANK_FLAG]:
        _rank_program(int(argv[1]), int(argv[2]), argv[3] if len(argv) > 3 else "")
        return 0
    if argv[:1] == [LINK_FLAG]:
        _link_program()
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--real", action="store_true",
                      help="start real MPI processes on this machine")
    mode.add_argument("--simulate", action="store_true",
                      help="run the stand-in: virtual ranks as threads of this process")
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--tensors", type=int, default=300)
    parser.add_argument("--steps", type=int, default=5, help="steady steps after the first")
    parser.add_argument("--cache-capacity", type=int, help="HVDKERAS_CACHE_CAPACITY")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", action="store_true", help="one JSON line")
    real = parser.add_argument_group("--real only")
    real.add_argument("--lab", default="", help="run over this network-namespace lab's hosts "
                      "(scripts/netlab.py up --hosts H --name LAB)")
    real.add_argument("--lab-hosts", type=int, default=2, help="with --lab: hosts to use")
    real.add_argument("--framework", choices=("jax", "torch"), default="",
                      help="framework ranks: Keras on this backend in every rank, the engine "
                      "started by hvdkeras.init() and the first collective through the "
                      "backend's allreduce (about 380 MiB a rank under JAX)")
    parser.add_argument("--rank0-caches", choices=("auto", *CACHE_MODELS), default="auto",
                        help="the stand-in's rank 0 (--simulate, and the prediction beside "
                        "--real): before each of its cycles cold writes twice the last-level "
                        "cache, private twice its core's own, warm nothing; auto is cold for "
                        "--simulate (every size alike) and for --real private where the real "
                        "steady cycle took under 10 ms, cold from there (Note [a cold rank 0])")
    simulated = parser.add_argument_group("--simulate only")
    simulated.add_argument("--stragglers", type=int, default=0,
                           help="ranks that submit each step one cycle late")
    simulated.add_argument("--allgathers", type=int, default=0,
                           help="of the tensors, how many are allgathers with per-rank rows")
    simulated.add_argument("--ranks-per-host", type=int, default=8)
    simulated.add_argument("--latency-us", type=float, help="the link's latency (default: measured)")
    simulated.add_argument("--gbps", type=float, help="the link's bandwidth (default: measured)")
    args = parser.parse_args(argv)
    if args.simulate:
        from hvdkeras.engine.control_plane_model import Link

        if args.latency_us is not None and args.gbps is not None:
            link = Link(args.latency_us * 1e-6, args.gbps * 1e9 / 8, "given")
        else:
            link = measure_link()
        result = run_simulated(args.ranks, args.tensors, args.steps, args.stragglers,
                               args.allgathers, 16384 if args.cache_capacity is None
                               else args.cache_capacity, args.ranks_per_host, link,
                               rank0_caches=args.rank0_caches)
    else:
        extra = {}
        if args.cache_capacity is not None:
            extra["HVDKERAS_CACHE_CAPACITY"] = str(args.cache_capacity)
        result = run_real(args.ranks, args.tensors, args.steps, extra, args.timeout,
                          args.lab, args.lab_hosts, args.framework)
        result.pop("stderr")
        result.update(predict_real(result, args.rank0_caches))
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What only two GPUs can show about failures, under KERAS_BACKEND=torch
with no TensorFlow (scripts/gpu_check.sh, on a machine with two or more
GPUs). Each mode starts a 2-rank job of its own and checks how it ended:

* `lone-failure`: inside a loop of 256 MiB allreduces, rank 1 fails before
  its NCCL call (it hands the engine a tensor on another GPU, which its own
  check refuses: Note [GPU checks are agreed] in ops/core/device_session.h)
  while rank 0 is already in its call. Both ranks must end with an error
  naming rank 1 within seconds, which is also how to learn whether NCCL
  blocks in an abort made while the peer's kernel still waits.
* `peer-death`: rank 1 is killed (SIGKILL) inside a 256 MiB allreduce; the
  job must end within the stall bound, rank 0 never left on its GPU.
* `two-communicators`: GPU allreduces on the global set and on a process
  set of each rank alone (two NCCL communicators on each GPU), then an
  orderly shutdown; both ranks must finish with exact sums and leave
  within the bound.

    KERAS_BACKEND=torch python tests/scripts/gpu_two_rank_failures.py MODE

`HVDKERAS_GPU_JOB_DEVICE=cpu` runs the modes that do not need GPUs on CPU
tensors (a dry run of this script's own logic on a machine without GPUs).
Exits 0 when the job ended as it must, 1 otherwise, saying why (2: a mode
that cannot run here).
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

BOUND_S = 60  # the stall bound given to the job
HERE = Path(__file__).resolve()

RANK_CODE = r"""
import os, signal, sys, threading, time
import torch
import hvdkeras as hvd

mode = sys.argv[1]
hvd.init()
rank = hvd.rank()
on_cpu = os.environ.get("HVDKERAS_GPU_JOB_DEVICE") == "cpu"
device = torch.device("cpu") if on_cpu else hvd.pin_gpu()
big = torch.ones(1 << 26, device=device)  # 256 MiB of float32
if mode == "lone-failure":
    other = torch.device("cuda", (torch.cuda.current_device() + 1) % torch.cuda.device_count())
    stray = torch.ones(1 << 26, device=other)
    try:
        for step in range(20):
            wrong = rank == 1 and step == 10
            hvd.allreduce(stray if wrong else big, op=hvd.Sum, name="loop").cpu()
        print(f"rank {rank}: NO ERROR", flush=True)
    except Exception as error:
        print(f"rank {rank}: ERROR at {time.time():.3f}: {error}", flush=True)
elif mode == "peer-death":
    for step in range(3):
        hvd.allreduce(big, op=hvd.Sum, name=f"warm.{step}").cpu()
    if rank == 1:
        def die():
            time.sleep(1.5)
            print(f"KILLED_AT {time.time():.3f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=die, daemon=True).start()
    try:
        for step in range(1000):
            hvd.allreduce(big, op=hvd.Sum, name="loop").cpu()
    except Exception as error:
        print(f"rank {rank}: ERROR at {time.time():.3f}: {error}", flush=True)
elif mode == "two-communicators":
    # A set of each rank alone (every rank registers both): with the global
    # set, two communicators on every GPU.
    alone = [hvd.add_process_set([0]), hvd.add_process_set([1])][rank]
    for step in range(5):
        whole = hvd.allreduce(big * (rank + 1), op=hvd.Sum, name=f"global.{step}")
        part = hvd.allreduce(big[:1000] * (rank + 1), op=hvd.Sum, name=f"set.{step}",
                             process_set=alone)
        assert float(whole[:1000].min().cpu()) == 3.0 == float(whole[-1000:].max().cpu())
        assert float(part.min().cpu()) == rank + 1.0 == float(part.max().cpu())
    began = time.time()
    hvd.shutdown()
    print(f"rank {rank}: SHUTDOWN in {time.time() - began:.1f} s", flush=True)
"""


def run(mode: str) -> int:
    if mode == "lone-failure" and os.environ.get("HVDKERAS_GPU_JOB_DEVICE") == "cpu":
        print("lone-failure needs two GPUs (a rank hands the engine a tensor on the other one)")
        return 2
    here = Path(sys.executable).parent
    mpiexec = here / "mpiexec" if (here / "mpiexec").exists() else shutil.which("mpiexec")
    env = {**os.environ, "KERAS_BACKEND": "torch",
           "HVDKERAS_STALL_SHUTDOWN_SECONDS": str(BOUND_S)}
    began = time.time()
    try:
        result = subprocess.run([str(mpiexec), "-n", "2", sys.executable, "-c", RANK_CODE, mode],
                                env=env, capture_output=True, text=True, timeout=3 * BOUND_S)
    except subprocess.TimeoutExpired as timeout:
        print(f"{mode}: the job did not end within {3 * BOUND_S} s (a hang)\n"
              f"{(timeout.stdout or b'')[-3000:]!r}")
        return 1
    took = time.time() - began
    out = result.stdout
    print(out[-4000:], result.stderr[-3000:])
    errors = [line for line in out.splitlines() if ": ERROR at " in line]
    if mode == "lone-failure":
        named = [line for line in errors if "rank 1" in line.split(": ERROR at ", 1)[1]]
        ok = len(named) == 2
        why = f"{len(named)} of 2 ranks ended with an error naming rank 1"
    elif mode == "peer-death":
        ok = "KILLED_AT" in out and result.returncode != 0 and took < 2 * BOUND_S
        why = f"the job ended {took:.0f} s after it began, exit {result.returncode}"
    else:
        ok = out.count("SHUTDOWN in") == 2 and result.returncode == 0
        why = f"{out.count('SHUTDOWN in')} of 2 ranks shut down, exit {result.returncode}"
    print(f"{mode}: {'as it must' if ok else 'WRONG'}: {why}, {took:.1f} s in all")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1]))

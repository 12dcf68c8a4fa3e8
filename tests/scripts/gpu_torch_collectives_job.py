"""The collectives of CUDA tensors under KERAS_BACKEND=torch on a real GPU
(scripts/gpu_check.sh): exact values against what each rank gave, results
left on the tensor's GPU, and the time of a 64 MiB allreduce against a plain
device copy of the same bytes. Needs no TensorFlow (the engine alone, Note
[the engine alone] in hvdkeras/engine/toolchain.py). Prints one CHECK line
per collective and "N failures"; exits 1 on any.

    KERAS_BACKEND=torch python tests/scripts/gpu_torch_collectives_job.py
"""
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "torch")

import torch  # noqa: E402

import hvdkeras as hvd  # noqa: E402

hvd.init()
device = hvd.pin_gpu()
rank, size = hvd.rank(), hvd.size()
failures = 0


def check(what: str, got: torch.Tensor, want: torch.Tensor) -> None:
    global failures
    on_gpu = got.device.type == "cuda"
    equal = got.shape == want.shape and bool(torch.equal(got.cpu(), want.cpu()))
    ok = on_gpu and equal
    failures += not ok
    print(f"CHECK rank {rank} {what}: {'ok' if ok else 'WRONG'}"
          f"{'' if on_gpu else ' (result left the GPU: ' + str(got.device) + ')'}", flush=True)
    if not equal:
        print(f"  got  {got.flatten()[:8].tolist()} shape {tuple(got.shape)}\n"
              f"  want {want.flatten()[:8].tolist()} shape {tuple(want.shape)}", flush=True)


cuda = torch.device("cuda", torch.cuda.current_device())
print(f"rank {rank} of {size}: pinned {device}, torch {torch.__version__}, "
      f"{torch.cuda.get_device_name(cuda)}", flush=True)
base = torch.arange(1000, dtype=torch.float32, device=cuda)
ranks_sum = size * (size - 1) / 2

check("allreduce sum float32", hvd.allreduce(base + rank, op=hvd.Sum),
      base * size + ranks_sum)
check("allreduce average float32", hvd.allreduce(base * size, op=hvd.Average), base * size)
check("allreduce prescale 0.5 postscale 4", hvd.allreduce(base, op=hvd.Sum, prescale_factor=0.5,
                                                          postscale_factor=4.0), base * 2 * size)
check("allreduce min int32", hvd.allreduce(base.int() + rank, op=hvd.Min), base.int())
check("allreduce max float16", hvd.allreduce(base.half() + rank, op=hvd.Max),
      base.half() + (size - 1))
grouped = hvd.grouped_allreduce([base + rank, base[:7].double() * 2, base[:3].long()],
                                op=hvd.Sum)
check("grouped allreduce (fused), part 1", grouped[0], base * size + ranks_sum)
check("grouped allreduce (fused), part 2", grouped[1], base[:7].double() * 2 * size)
check("grouped allreduce (fused), part 3", grouped[2], base[:3].long() * size)
check("broadcast from rank 0", hvd.broadcast(base + rank, root_rank=0), base)
rows = torch.full((rank + 1, 3), float(rank), device=cuda)
want = torch.cat([torch.full((r + 1, 3), float(r), device=cuda) for r in range(size)])
check("allgather of uneven rows", hvd.allgather(rows), want)
table = torch.arange(size * 4 * 2, dtype=torch.float32, device=cuda).reshape(size * 4, 2)
check("reducescatter sum", hvd.reducescatter(table, op=hvd.Sum),
      table[rank * 4:(rank + 1) * 4] * size)

# What the engine costs on the GPU: a 64 MiB allreduce against copying the
# same bytes on the device (the least any reduction there must move).
def timed(run, times: int = 10) -> float:
    """Seconds per call of `run`, the GPU's work included."""
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(times):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / times


big = torch.ones(16 << 20, dtype=torch.float32, device=cuda)
hvd.allreduce(big, op=hvd.Sum, name="warm")
last = [big]  # the latest result only: ten 64 MiB outputs need not stay
engine_s = timed(lambda: last.__setitem__(0, hvd.allreduce(big, op=hvd.Sum, name="timed")))
check("64 MiB allreduce sum", last[0][:1000], torch.full((1000,), float(size), device=cuda))
copy = torch.empty_like(big)
copy_s = timed(lambda: copy.copy_(big))
print(f"MEASURE rank {rank} 64 MiB allreduce {engine_s * 1e3:.3f} ms, device copy "
      f"{copy_s * 1e3:.3f} ms ({engine_s / copy_s:.1f}x)", flush=True)
if size > 1:
    # nccl-tests' bus bandwidth: bytes / time x 2(n-1)/n, what each link
    # carried; beside it torch.distributed's own NCCL allreduce in this job.
    def bus(seconds: float) -> float:
        return big.numel() * 4 / seconds * 2 * (size - 1) / size / 1e9

    peer = ""
    import torch.distributed as dist
    if dist.is_nccl_available():
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517", rank=rank,
                                world_size=size, device_id=cuda)
        theirs = big.clone()
        dist.all_reduce(theirs)
        peer_s = timed(lambda: dist.all_reduce(theirs))
        peer = (f", torch.distributed NCCL {bus(peer_s):.1f} GB/s "
                f"(hvdkeras {engine_s / peer_s:.2f}x its time)")
        dist.destroy_process_group()
    print(f"MEASURE rank {rank} 64 MiB allreduce bus bandwidth {bus(engine_s):.1f} GB/s "
          f"at {size} ranks{peer}", flush=True)
hvd.shutdown()
print(f"{failures} failures", flush=True)
sys.exit(1 if failures else 0)

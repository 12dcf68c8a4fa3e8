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
big = torch.ones(16 << 20, dtype=torch.float32, device=cuda)
hvd.allreduce(big, op=hvd.Sum, name="warm")
torch.cuda.synchronize()
began = time.perf_counter()
for step in range(10):
    out = hvd.allreduce(big, op=hvd.Sum, name="timed")
torch.cuda.synchronize()
engine_s = (time.perf_counter() - began) / 10
check("64 MiB allreduce sum", out[:1000], torch.full((1000,), float(size), device=cuda))
copy = torch.empty_like(big)
torch.cuda.synchronize()
began = time.perf_counter()
for step in range(10):
    copy.copy_(big)
torch.cuda.synchronize()
copy_s = (time.perf_counter() - began) / 10
print(f"MEASURE rank {rank} 64 MiB allreduce {engine_s * 1e3:.3f} ms, device copy "
      f"{copy_s * 1e3:.3f} ms ({engine_s / copy_s:.1f}x)", flush=True)
hvd.shutdown()
print(f"{failures} failures", flush=True)
sys.exit(1 if failures else 0)

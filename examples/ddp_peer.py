#!/usr/bin/env python3
"""The peer for the synthetic benchmark's lab mode: PyTorch DDP (gloo) training
a ResNet-50 on synthetic images, one rank per process.

Started under an MPI launcher (the lab's `hvdkerasrun`), which gives it its
rank and world and rank 0's address; the training itself is plain
`torch.nn.parallel.DistributedDataParallel` on `torch.distributed`'s gloo
backend (DDP's CPU backend), with DDP's default buckets. The network is the
ResNet-50 layout (bottleneck blocks 3-4-6-3, 25.6 M parameters, 97.5 MiB of
float32 gradients: the bytes of keras.applications.ResNet50 within 0.1%),
written here so the benchmark needs no torchvision. It prints one line,
`RESULT {"step_ms": ..., "gradient_bytes": ...}`, on rank 0.

    hvdkerasrun -np 2 python examples/ddp_peer.py --image-size 64 --batch-size 8
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

PORT = 29519


def resnet50(classes: int = 1000):
    """ResNet-50 in torch: a 7x7 stem, bottleneck stages of 3, 4, 6 and 3 blocks."""
    import torch.nn as nn  # lazy: only the peer needs torch

    def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> list:
        return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False),
                nn.BatchNorm2d(cout)]

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            cout = 4 * width
            self.body = nn.Sequential(*conv_bn(cin, width, 1), nn.ReLU(),
                                      *conv_bn(width, width, 3, stride), nn.ReLU(),
                                      *conv_bn(width, cout, 1))
            self.shortcut = (nn.Sequential(*conv_bn(cin, cout, 1, stride))
                             if stride != 1 or cin != cout else nn.Identity())
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.relu(self.body(x) + self.shortcut(x))

    layers = [*conv_bn(3, 64, 7, 2), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for block in range(blocks):
            layers.append(Bottleneck(cin, width, stride if block == 0 else 1))
            cin = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8, help="per rank")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--interface", default="", help="gloo's network interface")
    args = parser.parse_args()

    from mpi4py import MPI  # lazy: importing it starts MPI
    import torch  # lazy: the peer's framework
    import torch.distributed as dist  # lazy: the peer's framework

    comm = MPI.COMM_WORLD
    address = comm.bcast(socket.gethostbyname(socket.gethostname()), root=0)
    if args.interface:
        os.environ["GLOO_SOCKET_IFNAME"] = args.interface
    dist.init_process_group("gloo", init_method=f"tcp://{address}:{PORT}",
                            rank=comm.rank, world_size=comm.size)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(resnet50())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    images = torch.rand(args.batch_size, 3, args.image_size, args.image_size)
    labels = torch.randint(0, 1000, (args.batch_size,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        optimizer.zero_grad()
        loss_fn(model(images), labels).backward()
        optimizer.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    step_ms = max(comm.allgather(1000 * statistics.mean(times)))
    if comm.rank == 0:
        print("RESULT " + json.dumps({"step_ms": step_ms, "gradient_bytes": gradient_bytes}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

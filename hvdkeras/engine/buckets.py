"""Gradient buckets: which gradients share one engine request when they are
reduced while the backward pass goes on. Pure: no framework, no MPI.

Note [gradient buckets]
~~~~~~~~~~~~~~~~~~~~~~~
Back-propagation produces the gradients of a model's variables roughly in
reverse order: the last layers' first, the first layers' last. A reduction
that waits for every gradient leaves the network idle for the whole backward
pass, and the backward pass's end waits for the whole reduction. Cut into
buckets in that reverse order, the first bucket is ready soon after the
backward pass starts, and the engine reduces it while the layers below are
still being differentiated; buckets ready while the engine is busy are fused
into its next collective, so small buckets cost no bandwidth. The first
bucket closes at `first_limit` bytes (smaller: the link starts earlier), the
others at `limit` (one negotiation each: fewer costs less engine work on the
cores the backward pass uses). Every rank computes the same buckets from the
same variables, so the requests' names (the bucket's position) match. The
TensorFlow optimizer (hvdkeras/training/gradient_reduction.py) and the torch
backend's hooks (hvdkeras/backends/torch/backward_overlap.py) both plan with
`buckets`; `overlap_wanted` says when they do.

What may import this module: anything (standard library only).
"""

from __future__ import annotations

import os
from typing import Dict, List, Mapping, Optional, Sequence

from hvdkeras.engine import config

# A bucket's size in bytes (DDP's default bucket is 25 MB).
BUCKET_BYTES = 25 * 2**20
# The first bucket's: small, so the link starts while most of the backward
# pass is still ahead (DDP's first bucket is 1 MB).
FIRST_BUCKET_BYTES = 1 * 2**20
# A cross-step bucket's size (Note [priority on the wire] in
# ops/core/wire_order.h): a bucket the next forward pass needs sooner waits
# at most for the one on the wire, so the pieces are small; 4 MiB is 34 ms
# at 1 Gbit/s and still long enough for the ring to reach the link.
PIECE_BYTES = 4 * 2**20


def buckets(sizes: Sequence[int], dtypes: Sequence[str], limit: int = BUCKET_BYTES,
            first_limit: Optional[int] = None) -> List[List[int]]:
    """Groups variable positions into buckets in the order their gradients
    appear (the model's variables backwards), one dtype per bucket.

    Args:
        sizes: Each variable's gradient size in bytes, in the model's order.
        dtypes: Each variable's dtype.
        limit: A bucket closes once it holds this many bytes.
        first_limit: The first bucket of each dtype closes at this many bytes
            (default: `limit`).

    Returns:
        Lists of positions, in the order the buckets fill; each list in the
        order its gradients appear.

    Example:
        >>> buckets([8, 8, 8], ["float32"] * 3, limit=16)
        [[2, 1], [0]]
        >>> buckets([8, 8, 8], ["float32"] * 3, limit=16, first_limit=8)
        [[2], [1, 0]]
    """
    if len(sizes) != len(dtypes):
        raise ValueError(f"buckets: {len(sizes)} sizes but {len(dtypes)} dtypes.")
    open_by_dtype: Dict[str, List[int]] = {}
    filled: Dict[str, int] = {}
    closed: Dict[str, int] = {}
    result: List[List[int]] = []
    for position in reversed(range(len(sizes))):
        dtype = dtypes[position]
        bucket = open_by_dtype.get(dtype)
        if bucket is None:
            bucket = open_by_dtype[dtype] = []
            filled[dtype] = 0
            result.append(bucket)
        bucket.append(position)
        filled[dtype] += sizes[position]
        cap = limit if closed.get(dtype, 0) or first_limit is None else first_limit
        if filled[dtype] >= cap:
            del open_by_dtype[dtype]
            closed[dtype] = closed.get(dtype, 0) + 1
    return result


def overlap_wanted(local_size: int, size: int, env: Optional[Mapping[str, str]] = None,
                   mode: Optional[str] = None, on_gpus: bool = False) -> bool:
    """Whether gradients are reduced in buckets during the backward pass.

    `HVDKERAS_BACKWARD_OVERLAP`: "auto" (the default) when the ranks span
    several hosts: there the link, not the CPU, is the limit, and it idles
    during the backward pass otherwise; on one host the reduction is memory
    work on the cores the backward pass uses, and one fused request after
    it measured faster (docs/performance.md). Gradients on GPUs are the
    exception: NCCL moves them over NVLink or PCIe with the GPU's own copy
    engines and a few of its SMs, beside the backward pass's kernels rather
    than on the host's cores, so "auto" overlaps there on one host too (as
    DDP always does). "on" and "off" decide. The answer is the same on
    every rank (every rank of a multi-host job has fewer local ranks than
    ranks, and every rank's gradients are on the same kind of device), as
    the requests' names depend on it.
    `mode` ("auto", "on" or "off"), when given, is used instead of the
    variable (the torch backend passes its own knob's).

    Example:
        >>> overlap_wanted(1, 2, env={})
        True
        >>> overlap_wanted(2, 2, env={})
        False
        >>> overlap_wanted(2, 2, env={}, on_gpus=True)
        True
    """
    if mode is None:
        mode = config.backward_overlap(os.environ if env is None else env)
    if mode == "auto":
        return local_size < size or (on_gpus and size > 1)
    return mode == "on"


def bucket_limit(env: Optional[Mapping[str, str]] = None, default: int = BUCKET_BYTES) -> int:
    """A bucket's size: `HVDKERAS_BUCKET_BYTES`, else `default`."""
    return config.bucket_bytes(default, os.environ if env is None else env)

"""The memory floor's unit: the machine's aggregate copy bandwidth, measured with every rank copying."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

# The copy that measures the memory floor must be much larger than the caches; past 256 MiB it only
# costs time and memory (one source and one destination per rank).
COPY_MIN_BYTES = 64 << 20
COPY_MAX_BYTES = 256 << 20
COPY_REPS = 5
# The floor is the best the machine can do, so keep the best of a few trials, as STREAM does:
# a trial that a neighbouring process slowed down says nothing about the memory.
COPY_TRIALS = 5


def copy_bytes(maxbytes: int) -> int:
    """Size of each rank's buffer in the copy that measures the memory floor."""
    return min(max(COPY_MIN_BYTES, maxbytes), COPY_MAX_BYTES)


def measure_copy_bandwidth(nbytes: int, world: int, control) -> float:
    """Aggregate read+write bytes/s with every rank copying a buffer at once: the memory floor's unit."""
    # A plain copy, like the ring's own output writes: both pay a read-for-ownership of each
    # destination line on top of the bytes counted.
    src = torch.arange(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults are not what is being measured
    best = float("inf")
    for _ in range(COPY_TRIALS):
        dist.barrier(group=control)
        start = time.monotonic()
        for _ in range(COPY_REPS):
            dst.copy_(src)
        # Time from the first rank's start to the last rank's end, not the slowest rank alone: with
        # more ranks than cores, ranks that copy one after another must not count as copying at once.
        # CLOCK_MONOTONIC is one clock for the whole host, and the floor is a one-host figure.
        window = torch.tensor([-start, time.monotonic()], dtype=torch.float64)
        dist.all_reduce(window, op=dist.ReduceOp.MAX, group=control)
        best = min(best, window.sum().item())
    return world * 2 * src.nbytes * COPY_REPS / best

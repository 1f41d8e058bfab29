"""CUDA mode's measurements: the GPU's copy bandwidth, ringreduce's reduction kernel, and NCCL at
world size 1 as the launch-overhead floor. Nothing here touches CUDA at import."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringreduce import _launch

from .collectives import COLLECTIVES, DTYPES, PROG
from .floor import COPY_TRIALS
from .timing import probe_support, time_collective

# CUDA mode: the GPU's copy, and ringreduce's reduction kernel, are measured on buffers far larger
# than the GPU's L2 (50 MiB on an H100), timed with CUDA events over GPU_REPS calls after
# GPU_WARMUP untimed ones, the best of COPY_TRIALS such runs.
GPU_COPY_MIN_BYTES = 256 << 20
KERNEL_BYTES = 256 << 20
GPU_REPS = 20
GPU_WARMUP = 3


@dataclass
class Gpu:
    """What rank 0 measured of its GPU before the table, with the other ranks idle."""

    index: int
    name: str
    visible: int  # GPUs visible to torch
    shared: bool  # every rank on this one GPU, whose memory the floor is about
    copy_bytes: int
    copy_bw: float  # read+write bytes/s of a device-to-device copy
    kernel_bw: float | None  # read+write bytes/s of ringreduce's reduction kernel; None: not measured
    kernel_note: str  # why the kernel was not measured


def _cuda_seconds(fn: Callable[[], object]) -> float:
    """Time of one call of `fn`, which queues GPU work on the current stream, from CUDA events:
    the best of COPY_TRIALS runs of GPU_REPS calls, after GPU_WARMUP untimed ones."""
    for _ in range(GPU_WARMUP):
        fn()
    best = float("inf")
    for _ in range(COPY_TRIALS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(GPU_REPS):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3 / GPU_REPS)  # elapsed_time is in ms
    return best


def measure_reduce_kernel(device: torch.device) -> tuple[float | None, str]:
    """Read+write bytes/s of ringreduce's own reduction kernel on `device` (float32 sum of two
    KERNEL_BYTES buffers into a third: three buffers' bytes per call), or None and why not."""
    try:
        import ringreduce

        ext = ringreduce.load_extension()
    except ImportError as e:
        return None, str(e).splitlines()[0]
    if not ext.built_with_cuda:
        from ringreduce import _build_info

        note = getattr(_build_info, "CUDA_NOTE", "setup.py recorded no reason")
        return None, f"ringreduce._C was built without CUDA: {note}"
    # Values in [0, 1): no denormals or infinities to slow the arithmetic down.
    a = torch.rand(KERNEL_BYTES // 4, dtype=torch.float32, device=device)
    b = torch.rand_like(a)
    dst = torch.empty_like(a)
    return 3 * a.nbytes / _cuda_seconds(lambda: ext.reduce_tensors(dst, a, b, "sum")), ""


def measure_cuda_copy_bandwidth(nbytes: int, device: torch.device) -> float:
    """Read+write bytes/s of a device-to-device copy of `nbytes` on `device`: the memory floor's unit."""
    src = torch.arange(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return 2 * src.nbytes / _cuda_seconds(lambda: dst.copy_(src))


def measure_gpu(maxbytes: int, device: torch.device, world: int) -> Gpu:
    """The GPU's copy bandwidth and ringreduce's kernel, one after the other (each frees its buffers)."""
    nbytes = max(GPU_COPY_MIN_BYTES, maxbytes)
    copy_bw = measure_cuda_copy_bandwidth(nbytes, device)
    kernel_bw, kernel_note = measure_reduce_kernel(device)
    visible = torch.cuda.device_count()
    return Gpu(device.index, torch.cuda.get_device_name(device), visible, min(world, visible) == 1, nbytes,
               copy_bw, kernel_bw, kernel_note)


def nccl_floor(args: argparse.Namespace, device: torch.device, sizes: list[int]):
    """NCCL's time for the op at world size 1 on this GPU: ([(bytes, out-of-place seconds, in-place
    seconds)] at each size, None), or (None, why it was not measured). A set NCCL cannot run (or
    that the collective lacks) has None for its seconds.

    NCCL refuses two ranks on one GPU, but a rank alone still pays what every NCCL op pays (a kernel
    launch and the communicator's bookkeeping): a floor under the small sizes. It runs in a fresh
    process of its own, since this one's default group is the benchmark's.
    """
    if not dist.is_nccl_available():
        return None, "this torch has no NCCL (torch.distributed.is_nccl_available() is False)"
    with tempfile.TemporaryDirectory(prefix="ringreduce-bench-") as tmp:
        path = os.path.join(tmp, "nccl.json")
        status = _launch.spawn(_nccl_rank, 1, args.timeout, (args, device.index, sizes, path),
                               name=f"{PROG} (NCCL floor)")
        if status != 0:
            return None, f"the NCCL process failed with status {status}; its error is above, on stderr"
        with open(path) as f:
            done = json.load(f)
    if done["unsupported"]:
        return None, f"NCCL cannot run {args.op} {args.dtype} {args.redop} here: {done['unsupported']}"
    return [tuple(row) for row in done["times"]], None


def _nccl_rank(rank: int, world: int, store, args: argparse.Namespace, index: int, sizes: list[int],
               path: str) -> None:
    """nccl_floor's process: times the op with NCCL alone on GPU `index`, the results to `path`."""
    torch.cuda.set_device(index)
    device = torch.device("cuda", index)
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, timeout=timeout)
    try:
        control = dist.new_group(backend="gloo", timeout=timeout)
        coll, dtype = COLLECTIVES[args.op], DTYPES[args.dtype]
        # One op before the timing: NCCL builds its communicator at the first, and here it also
        # says whether it has this dtype and redop (it has no int16, say).
        unsupported = probe_support(coll, dtype, args.redop, dist.group.WORLD, control, device)
        times = []
        if unsupported is None:
            # The native set is known to run; the other may not (alltoall has no in-place form).
            world_group = dist.group.WORLD
            runs = [inplace == coll.native_in_place
                    or probe_support(coll, dtype, args.redop, world_group, control, device, inplace) is None
                    for inplace in (False, True)]
            for size in sizes:
                buf = torch.zeros(size // dtype.itemsize, dtype=dtype, device=device)
                times.append((size, *(time_collective(coll, buf, args, world_group, control, inplace) if ok
                                      else None for inplace, ok in zip((False, True), runs, strict=True))))
    finally:
        dist.destroy_process_group()
    with open(path, "w") as f:
        json.dump({"unsupported": unsupported, "times": times}, f)

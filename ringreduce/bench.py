"""Bandwidth benchmark in the style of nccl-tests: ringreduce beside gloo, side by side in one run.

    python -m ringreduce.bench                     # 2 local ranks, 1K..64M, float32 sum
    python -m ringreduce.bench -g 4 -d bfloat16 -o max
    torchrun --nproc-per-node 4 -m ringreduce.bench
    python -m ringreduce.bench --device cuda -g 2  # CUDA tensors, every rank on one GPU

Both backends run in the same processes and alternate at every size, so machine noise hits both alike:
machines are noisy, and only ratios measured side by side are worth quoting. Barriers and the
bookkeeping reductions go through a separate gloo group, so a measured backend runs nothing but the
measured collective. The run also measures the machine's aggregate copy bandwidth, which bounds any
same-host collective, and prints how close ringreduce gets to that floor.

With --device cuda the buffers are CUDA tensors and rank r uses GPU r % (GPUs visible): with one GPU,
every rank shares it, and the floor is that GPU's copy bandwidth against the bytes all ranks move
through its memory together. NCCL cannot put two ranks on one GPU, so it is not a column; instead
rank 0 times it at world size 1 after the table, in a process of its own, as the launch-overhead floor.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringreduce import _launch

PROG = "ringreduce.bench"
BUILD_HINT = "build it with `make build` or `pip install --no-build-isolation --no-deps -e .`"

DTYPES = {
    name: getattr(torch, name)
    for name in ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "int32", "int64")
}
REDOPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}

# The copy that measures the memory floor must be much larger than the caches; past 256 MiB it only
# costs time and memory (one source and one destination per rank).
COPY_MIN_BYTES = 64 << 20
COPY_MAX_BYTES = 256 << 20
COPY_REPS = 5
# The floor is the best the machine can do, so keep the best of a few trials, as STREAM does:
# a trial that a neighbouring process slowed down says nothing about the memory.
COPY_TRIALS = 5
# The correctness check builds its reference in float64 this many elements at a time, to bound memory.
CHECK_CHUNK = 1 << 20
# CUDA mode: the GPU's copy, and ringreduce's reduction kernel, are measured on buffers far larger
# than the GPU's L2 (50 MiB on an H100), timed with CUDA events over GPU_REPS calls after
# GPU_WARMUP untimed ones, the best of COPY_TRIALS such runs.
GPU_COPY_MIN_BYTES = 256 << 20
KERNEL_BYTES = 256 << 20
GPU_REPS = 20
GPU_WARMUP = 3
# The headline sizes of the CUDA summary (ranks sharing one GPU, world size 2): a large op against
# the memory floor and gloo, and a small one's latency.
HEADLINE_LARGE_BYTES = 256 << 20
HEADLINE_SMALL_BYTES = 8 << 10


# ---------------------------------------------------------------------------------------------------
# Sizes

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from '1024', '1K', '64M', '1G' (binary units, as in nccl-tests; 'KB'/'KiB' also read)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(
            f"cannot parse size {text!r}: expected a whole number with an optional K, M or G suffix"
        )
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def size_sweep(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return sizes


# ---------------------------------------------------------------------------------------------------
# Byte models


def allreduce_busbw_factor(world: int) -> float:
    """busbw / algbw for all_reduce: each rank sends and receives 2(n-1)/n of the buffer in a ring.

    With one rank nothing moves; 1 keeps busbw equal to algbw instead of printing zeros.
    """
    return 2 * (world - 1) / world if world > 1 else 1.0


def ringreduce_allreduce_bytes(nbytes: int, world: int) -> int:
    """Bytes that must cross main memory, summed over all ranks, in one ringreduce all_reduce.

    The memory floor of the benchmark is this divided by the machine's aggregate copy bandwidth.
    It follows ringreduce's shared-memory ring; change it here if the ring changes. In units of one
    chunk (nbytes / n), each rank touches:
        step 0: copy its own chunk into a shared slot                            2 (read, write)
        n-2 reduce steps: read the incoming slot and the input, write next slot  3 each
        last reduce step: the same, and also write the reduced chunk to output   4
        n-2 all-gather steps: read a slot, write the output and the next slot    3 each
        final step: read the last slot, write the output                         2
    That is 6n-4 chunks per rank, but a link's slots are a few slices that stay in cache while the
    neighbour reads them (the slice size is chosen so). What must reach memory is each rank
    reading its input once and writing its output once: 2 * nbytes per rank, 2n * nbytes in all,
    in the units of a plain copy (which also pays a read-for-ownership per written line). One
    rank, in place, moves nothing.
    """
    return 2 * world * nbytes if world > 1 else 0


def ringreduce_cuda_allreduce_bytes(nbytes: int, world: int) -> int:
    """Bytes that pass through one GPU's memory, summed over all ranks, in one ringreduce all_reduce
    of CUDA tensors with every rank on that GPU: their traffic adds up in the one memory.

    It follows the ring's kernels over CUDA IPC, where a slot is device memory in the successor's
    inbox; change it here if the ring changes. In units of one chunk (nbytes / n), each rank reads +
    writes:
        reduce-scatter, first step: copy its input chunk into the successor's slot      2
        n-2 middle steps: read the received slot and the input, write the next slot      3 each
        last step: the same into the outgoing slot, then copy that slot to the output   3 + 2
        all-gather, n-2 forwarded chunks: slot to the next slot, and slot to the output  4 each
        the last chunk received: slot to the output                                       2
    That is 2 + 3(n-2) + 5 + 4(n-2) + 2 = 7n-5 chunks per rank and (7n-5) * nbytes for all n ranks.
    Unlike the host ring's model, the slots count: this is the floor for these kernels as if nothing
    stayed in the GPU's L2, so slots that do stay there can let an op beat it. One rank, in place,
    moves nothing.
    """
    return (7 * world - 5) * nbytes if world > 1 else 0


# ---------------------------------------------------------------------------------------------------
# Correctness check


def check_input(redop: str, signed: bool, world: int, rank: int, idx: torch.Tensor) -> torch.Tensor:
    """Rank `rank`'s check input at element indices `idx`, as float64 small integers.

    Chosen so that the result and every partial result are small integers, exact in every dtype
    (fp16 holds integers to 2048, bf16 to 256) whatever order a backend reduces in: sum, min and
    max lie in [-2n, 2n], prod in {-2, -1, 1, 2} (one factor of 2 per element at most), and avg
    inputs are n times the sum inputs so the average is an integer too. Unsigned dtypes get the
    same values shifted to be non-negative. Exact for world sizes up to 7 in every dtype (the
    tightest case is avg in int8); larger worlds can overflow the small integer types.
    """
    base = ((rank + 1) * (idx % 7 + 1)) % 5
    if signed:
        base = base - 2
    if redop == "prod":
        two = torch.where(idx % world == rank, 2, 1)
        sign = torch.where((idx + rank) % 3 == 0, -1, 1) if signed else 1
        return (two * sign).to(torch.float64)
    if redop == "avg":
        base = base * world
    return base.to(torch.float64)


_COMBINE = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}


def expected_result(redop: str, signed: bool, world: int, idx: torch.Tensor) -> torch.Tensor:
    acc = check_input(redop, signed, world, 0, idx)
    for rank in range(1, world):
        acc = _COMBINE[redop](acc, check_input(redop, signed, world, rank, idx))
    return acc / world if redop == "avg" else acc


def _count_wrong(got: torch.Tensor, want: torch.Tensor, redop: str, floating: bool) -> int:
    if redop == "avg" and floating:
        # Every correct average here is an integer and any wrong one is off by a whole unit, so a
        # quarter tolerates a backend that multiplies by 1/n (inexact for n = 3) and hides nothing.
        return int((~((got - want).abs() <= 0.25)).sum())
    return int((got != want).sum())


def check_all_reduce(
    count: int, dtype: torch.dtype, redop: str, group, rank: int, world: int, device: torch.device
) -> int:
    """Run one all_reduce on known inputs on `device`; return how many of this rank's output
    elements are wrong. The float64 reference is built on the host, as the results are compared."""
    signed = dtype.is_floating_point or dtype.is_signed
    buf = torch.empty(count, dtype=dtype, device=device)
    for lo in range(0, count, CHECK_CHUNK):
        idx = torch.arange(lo, min(lo + CHECK_CHUNK, count))
        buf[lo : lo + len(idx)] = check_input(redop, signed, world, rank, idx).to(dtype)
    dist.all_reduce(buf, op=REDOPS[redop], group=group)
    wrong = 0
    for lo in range(0, count, CHECK_CHUNK):
        idx = torch.arange(lo, min(lo + CHECK_CHUNK, count))
        got = buf[lo : lo + len(idx)].to("cpu", torch.float64)
        wrong += _count_wrong(got, expected_result(redop, signed, world, idx), redop, dtype.is_floating_point)
    return wrong


# ---------------------------------------------------------------------------------------------------
# Collectives


@dataclass(frozen=True)
class Collective:
    name: str
    # (buf, redop, group, world) -> a call that runs the collective once. `buf` holds the size being
    # measured (the whole buffer, as nccl-tests counts it); outputs are allocated here, once, so
    # that allocation stays out of the timing. Results are not checked.
    prepare: Callable[[torch.Tensor, str, object, int], Callable[[], None]]
    # Runs it once on known inputs on a device:
    # (count, dtype, redop, group, rank, world, device) -> wrong elements here.
    check: Callable[[int, torch.dtype, str, object, int, int, torch.device], int]
    busbw_factor: Callable[[int], float]
    busbw_formula: str
    # Bytes ringreduce reads plus writes machine-wide for one op of N bytes on n ranks.
    floor_bytes: Callable[[int, int], int]
    floor_formula: str
    # The same through one GPU's memory, for CUDA tensors with every rank on that GPU; None where
    # there is no model (the floor columns then read N/A).
    cuda_floor_bytes: Callable[[int, int], int] | None = None
    cuda_floor_formula: str = ""


def _prepare_all_reduce(buf, redop, group, world):
    return lambda: dist.all_reduce(buf, op=REDOPS[redop], group=group)


def _prepare_reduce_scatter(buf, redop, group, world):
    per = buf.numel() // world  # N is the input; each rank keeps N/n
    out = torch.empty(per, dtype=buf.dtype, device=buf.device)
    inp = buf[: per * world]
    return lambda: dist.reduce_scatter_tensor(out, inp, op=REDOPS[redop], group=group)


def _prepare_all_gather(buf, redop, group, world):
    per = buf.numel() // world  # N is the output; each rank brings N/n
    inp = buf[:per].clone()
    out = buf[: per * world]
    return lambda: dist.all_gather_into_tensor(out, inp, group=group)


def _prepare_broadcast(buf, redop, group, world):
    return lambda: dist.broadcast(buf, src=0, group=group)


def _prepare_reduce(buf, redop, group, world):
    return lambda: dist.reduce(buf, dst=0, op=REDOPS[redop], group=group)


def _prepare_alltoall(buf, redop, group, world):
    n = buf.numel() // world * world  # N per rank, N/n to each peer
    inp = buf[:n]
    out = torch.empty_like(inp)
    return lambda: dist.all_to_all_single(out, inp, group=group)


def _data(dtype, signed, world, rank, idx):
    """Known values for the ops that only move data: exact in every dtype, different per rank."""
    return check_input("sum", signed, world, rank, idx).to(dtype)


# The check_* functions below run the op on `device` and compare on the host, where the expected
# values are built.


def check_reduce_scatter(count, dtype, redop, group, rank, world, device):
    signed = dtype.is_floating_point or dtype.is_signed
    per = count // world
    inp = check_input(redop, signed, world, rank, torch.arange(per * world)).to(device, dtype)
    out = torch.empty(per, dtype=dtype, device=device)
    dist.reduce_scatter_tensor(out, inp, op=REDOPS[redop], group=group)
    want = expected_result(redop, signed, world, torch.arange(rank * per, (rank + 1) * per))
    return _count_wrong(out.to("cpu", torch.float64), want, redop, dtype.is_floating_point)


def check_reduce(count, dtype, redop, group, rank, world, device):
    signed = dtype.is_floating_point or dtype.is_signed
    idx = torch.arange(count)
    buf = check_input(redop, signed, world, rank, idx).to(device, dtype)
    dist.reduce(buf, dst=0, op=REDOPS[redop], group=group)
    if rank != 0:
        return 0
    return _count_wrong(buf.to("cpu", torch.float64), expected_result(redop, signed, world, idx), redop,
                        dtype.is_floating_point)


def check_all_gather(count, dtype, redop, group, rank, world, device):
    signed = dtype.is_floating_point or dtype.is_signed
    per = count // world
    out = torch.empty(per * world, dtype=dtype, device=device)
    dist.all_gather_into_tensor(out, _data(dtype, signed, world, rank, torch.arange(per)).to(device),
                                group=group)
    want = torch.cat([_data(dtype, signed, world, q, torch.arange(per)) for q in range(world)])
    return int((out.cpu() != want).sum())


def check_broadcast(count, dtype, redop, group, rank, world, device):
    signed = dtype.is_floating_point or dtype.is_signed
    idx = torch.arange(count)
    buf = _data(dtype, signed, world, rank, idx).to(device)
    dist.broadcast(buf, src=0, group=group)
    return int((buf.cpu() != _data(dtype, signed, world, 0, idx)).sum())


def check_alltoall(count, dtype, redop, group, rank, world, device):
    signed = dtype.is_floating_point or dtype.is_signed
    per = count // world
    inp = _data(dtype, signed, world, rank, torch.arange(per * world)).to(device)
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp, group=group)
    got = out.cpu()
    # Chunk q of the output is chunk `rank` of rank q's input.
    want = torch.cat([_data(dtype, signed, world, q, torch.arange(rank * per, (rank + 1) * per))
                      for q in range(world)]) if per else got
    return int((got != want).sum())


def _gather_scatter_factor(n: int) -> float:
    return (n - 1) / n if n > 1 else 1.0


# Bytes that must cross main memory machine-wide for one op of N bytes on n ranks (as for
# all_reduce, slots stay in cache): reduce_scatter reads N and writes N/n per rank; all_gather
# reads N/n and writes N per rank; broadcast's root reads N and every other rank writes N;
# reduce reads N on every rank and writes N on the root; alltoall reads and writes N per rank.
COLLECTIVES = {
    c.name: c
    for c in (
        Collective("all_reduce", _prepare_all_reduce, check_all_reduce, allreduce_busbw_factor,
                   "2(n-1)/n", ringreduce_allreduce_bytes, "2n*N", ringreduce_cuda_allreduce_bytes,
                   "(7n-5)*N"),
        Collective("reduce_scatter", _prepare_reduce_scatter, check_reduce_scatter,
                   _gather_scatter_factor, "(n-1)/n", lambda N, n: (n + 1) * N if n > 1 else 0,
                   "(n+1)*N"),
        Collective("all_gather", _prepare_all_gather, check_all_gather, _gather_scatter_factor,
                   "(n-1)/n", lambda N, n: (n + 1) * N if n > 1 else 0, "(n+1)*N"),
        Collective("broadcast", _prepare_broadcast, check_broadcast, lambda n: 1.0, "1",
                   lambda N, n: n * N if n > 1 else 0, "n*N"),
        Collective("reduce", _prepare_reduce, check_reduce, lambda n: 1.0, "1",
                   lambda N, n: (n + 1) * N if n > 1 else 0, "(n+1)*N"),
        Collective("alltoall", _prepare_alltoall, check_alltoall, _gather_scatter_factor,
                   "(n-1)/n", lambda N, n: 2 * n * N if n > 1 else 0, "2n*N"),
    )
}


# ---------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description="nccl-tests-style bandwidth table for ringreduce beside gloo, measured in one run.",
        epilog="Sizes take K, M, G suffixes (powers of 1024). Under torchrun the ranks come from the "
        "environment (env://) and nothing is spawned.",
    )
    p.add_argument(
        "-g", "--nproc", type=int, help="local ranks to start (default 2; under torchrun: its world size)"
    )
    p.add_argument("-b", "--minbytes", type=_size_arg, default="1K", help="smallest size (default 1K)")
    p.add_argument("-e", "--maxbytes", type=_size_arg, default="64M", help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplier between rows (default 4)")
    p.add_argument(
        "-n",
        "--iters",
        type=int,
        default=20,
        help="timed iterations per size, at least (default 20; more where they take under --min-time)",
    )
    p.add_argument(
        "--min-time",
        type=float,
        default=0.2,
        help="seconds each measurement lasts at least: small sizes get more iterations, the same on "
        "every rank (default 0.2; 0 for exactly -n)",
    )
    p.add_argument("-w", "--warmup", type=int, default=5, help="untimed iterations before them (default 5)")
    p.add_argument("-d", "--dtype", choices=DTYPES, default="float32", help="element type (default float32)")
    p.add_argument("-o", "--redop", choices=REDOPS, default="sum", help="reduction (default sum)")
    p.add_argument("--op", choices=COLLECTIVES, default="all_reduce", help="collective (default all_reduce)")
    p.add_argument("--json", metavar="FILE", help="also write every row, per backend, to FILE as JSON")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw busbw against size, one line per backend, to FILE.png (needs matplotlib: "
        "pip install matplotlib, or the package's 'plot' extra)",
    )
    p.add_argument(
        "--backends",
        type=_backends_arg,
        default="ringreduce,gloo",
        help="comma-separated backends, measured in this order; the first gets the memory-floor columns, "
        "the ratio compares the first with the second (default ringreduce,gloo)",
    )
    p.add_argument(
        "-c",
        "--check",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="count wrong result elements after each size (default on)",
    )
    p.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a hung run is killed (default 600)"
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the buffers live (default cpu); cuda: rank r on GPU r %% (GPUs visible), so with "
        "one GPU every rank shares it",
    )
    p.add_argument(
        "--nccl-floor",
        action=argparse.BooleanOptionalAction,
        help="with --device cuda: after the table, time NCCL at world size 1 on the same sizes, in a "
        "process of its own, as the launch-overhead floor (default on with --device cuda)",
    )
    return p


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _backends_arg(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"empty backend name in {text!r}")
    return names


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.nproc is not None and args.nproc < 1:
        parser.error("--nproc must be at least 1")
    if args.minbytes < 1 or args.maxbytes < args.minbytes:
        parser.error(f"need 1 <= --minbytes <= --maxbytes, got {args.minbytes} and {args.maxbytes}")
    if args.stepfactor < 2:
        parser.error("--stepfactor must be at least 2")
    if args.iters < 1 or args.warmup < 0:
        parser.error("need --iters >= 1 and --warmup >= 0")
    if args.timeout <= 0:
        parser.error("--timeout must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        parser.error(
            f"--device cuda needs a GPU, but torch.cuda.is_available() is False ({why}; "
            f"torch {torch.__version__})"
        )
    if args.nccl_floor is None:
        args.nccl_floor = args.device == "cuda"
    elif args.nccl_floor and args.device != "cuda":
        parser.error("--nccl-floor needs --device cuda")
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - checked now rather than after the whole run
        except ImportError:
            parser.error("--plot needs matplotlib: pip install matplotlib (or the 'plot' extra)")
    return args


# ---------------------------------------------------------------------------------------------------
# Backends


class BackendUnavailable(RuntimeError):
    pass


def ensure_backend(name: str) -> None:
    """Make `name` usable by init_process_group and new_group in this process, or say why not."""
    if name == "ringreduce":
        try:
            import ringreduce  # importing registers the backend with torch.distributed
        except ImportError as e:
            raise BackendUnavailable(f"cannot import ringreduce ({e}); {BUILD_HINT}") from e
        # Registering does not load the compiled extension; load it now so that a missing or stale
        # build is reported once, before any rank starts, rather than inside every rank.
        try:
            ringreduce.load_extension()
        except ImportError as e:
            raise BackendUnavailable(str(e)) from e  # it says why, and how to rebuild
        if name not in dist.Backend.backend_list:
            raise BackendUnavailable(
                f"`import ringreduce` did not register the 'ringreduce' backend; {BUILD_HINT}"
            )
    elif name not in dist.Backend.backend_list:
        raise BackendUnavailable(
            f"unknown backend {name!r}; torch.distributed knows {dist.Backend.backend_list}"
        )


# ---------------------------------------------------------------------------------------------------
# Measurement (runs on every rank)


@dataclass
class Result:
    time_s: float | None  # None: the backend does not support this dtype and redop
    wrong: int | None  # None: not checked


def _max_over_ranks(value: float, control) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control)
    return t.item()


def _sum_over_ranks(value: int, control) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=control)
    return int(t.item())


def verify_same_plan(args: argparse.Namespace, rank: int, world: int, control) -> None:
    """Every rank must run the same sizes and iteration counts, or the collectives would not match up."""
    keys = (
        "op",
        "dtype",
        "redop",
        "minbytes",
        "maxbytes",
        "stepfactor",
        "iters",
        "warmup",
        "backends",
        "check",
        "device",
    )
    plan = {k: getattr(args, k) for k in keys}
    plans = [None] * world
    dist.all_gather_object(plans, plan, group=control)
    for other, theirs in enumerate(plans):
        if theirs != plan:
            raise ValueError(
                f"{PROG}: rank {rank} runs {plan} but rank {other} runs {theirs}; "
                "give all ranks the same options"
            )


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


def probe_support(
    coll: Collective, dtype: torch.dtype, redop: str, group, control, device: torch.device
) -> str | None:
    """Why this backend cannot run the collective with this dtype and redop on `device`, or None
    when it can.

    Backends reject an unsupported dtype, redop or device before communicating, identically on every
    rank, so catching the error here leaves the group usable; the ranks then agree through the
    control group.
    """
    try:
        coll.prepare(torch.zeros(1, dtype=dtype, device=device), redop, group, dist.get_world_size(group))()
        reason = None
    except (RuntimeError, ValueError) as e:
        reason = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    if _max_over_ranks(float(reason is not None), control) and reason is None:
        reason = "unsupported on another rank"
    return reason


# Small ops take microseconds; the barrier before a measurement releases ranks hundreds of
# microseconds apart, so a handful of iterations would measure that skew, not the op.
MAX_ITERS = 100_000


def iterations(args: argparse.Namespace, seconds_per_iter: float) -> int:
    """Timed iterations for one size: -n, or more so the measurement lasts --min-time."""
    if args.min_time <= 0 or seconds_per_iter <= 0:
        return args.iters
    return max(args.iters, min(MAX_ITERS, math.ceil(args.min_time / seconds_per_iter)))


def _wait_for_device(t: torch.Tensor) -> None:
    """Let the GPU finish what was queued for `t`'s device: a CUDA collective returns once its work
    is queued, so a clock read without this would time the queueing. Nothing to wait for on a CPU."""
    if t.is_cuda:
        torch.cuda.synchronize(t.device)


def time_collective(coll: Collective, buf: torch.Tensor, args: argparse.Namespace, group, control) -> float:
    """Max over ranks of the mean time of one iteration, in seconds."""
    run = coll.prepare(buf, args.redop, group, dist.get_world_size(group))
    _wait_for_device(buf)
    start = time.perf_counter()
    for _ in range(args.warmup):
        run()
    _wait_for_device(buf)
    # Every rank must run the same number of iterations: derive it from the slowest rank's warm-up.
    per_iter = _max_over_ranks((time.perf_counter() - start) / max(args.warmup, 1), control)
    iters = iterations(args, per_iter if args.warmup else 0.0)
    dist.barrier(group=control)
    _wait_for_device(buf)
    start = time.perf_counter()
    for _ in range(iters):
        run()
    _wait_for_device(buf)
    return _max_over_ranks((time.perf_counter() - start) / iters, control)


# ---------------------------------------------------------------------------------------------------
# The GPU (CUDA mode)


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
    """NCCL's time for the op at world size 1 on this GPU: ([(bytes, seconds)] at each size, None),
    or (None, why it was not measured).

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
            for size in sizes:
                buf = torch.zeros(size // dtype.itemsize, dtype=dtype, device=device)
                times.append((size, time_collective(coll, buf, args, dist.group.WORLD, control)))
    finally:
        dist.destroy_process_group()
    with open(path, "w") as f:
        json.dump({"unsupported": unsupported, "times": times}, f)


def run_rank(rank: int, world: int, store, args: argparse.Namespace) -> None:
    """One rank's whole benchmark. `store` is the launcher's TCPStore, or None to rendezvous via env://."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        # Before any group exists: backends bind a rank's CUDA work to the current device.
        torch.cuda.set_device(rank % torch.cuda.device_count())
    for name in set(args.backends):
        ensure_backend(name)
    timeout = datetime.timedelta(seconds=args.timeout)
    rendezvous = (
        {"store": store, "rank": rank, "world_size": world}
        if store is not None
        else {"init_method": "env://"}
    )
    dist.init_process_group(args.backends[0], timeout=timeout, **rendezvous)
    try:
        groups = [dist.group.WORLD] + [
            dist.new_group(backend=name, timeout=timeout) for name in args.backends[1:]
        ]
        control = dist.new_group(backend="gloo", timeout=timeout)
        bare = None
        if args.backends[0] == "ringreduce" and args.op == "all_reduce":
            # The same backend without its per-op safety work, to say what that work costs: no
            # fingerprint comparison on receive and no flight recorder (knobs read at creation).
            saved = {k: os.environ.get(k) for k in SAFETY_OFF}
            os.environ.update(SAFETY_OFF)
            try:
                bare = dist.new_group(backend="ringreduce", timeout=timeout)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        _bench(rank, world, args, groups, control, bare)
    finally:
        dist.destroy_process_group()


SAFETY_OFF = {"RINGREDUCE_CHECK_FINGERPRINTS": "0", "RINGREDUCE_FLIGHT_RECORDER": "0"}
SAFETY_ROUNDS = 5


def safety_cost(args: argparse.Namespace, dtype, sizes: list[int], safe, bare, control, device):
    """Median time per op at each size with the safety work on (`safe`) and off (`bare`),
    measured in alternation so that drift on a shared machine hits both alike."""
    coll = COLLECTIVES[args.op]
    out = []
    for size in sizes:
        buf = torch.zeros(size // dtype.itemsize, dtype=dtype, device=device)
        on, off = [], []
        for _ in range(SAFETY_ROUNDS):
            on.append(time_collective(coll, buf, args, safe, control))
            off.append(time_collective(coll, buf, args, bare, control))
        out.append((size, statistics.median(on), statistics.median(off)))
    return out


def _bench(rank: int, world: int, args: argparse.Namespace, groups: list, control, bare=None) -> None:
    verify_same_plan(args, rank, world, control)
    coll = COLLECTIVES[args.op]
    dtype = DTYPES[args.dtype]
    gpu = None
    if args.device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        # Rank 0 measures the GPU alone while the others wait here: they share it, and any work of
        # theirs would be measured too. Only rank 0 reports, so only it needs the figures.
        if rank == 0:
            gpu = measure_gpu(args.maxbytes, device, world)
        dist.barrier(group=control)
        copy_bw = gpu.copy_bw if gpu is not None else None
    else:
        device = torch.device("cpu")
        copy_bw = measure_copy_bandwidth(copy_bytes(args.maxbytes), world, control)
    unsupported = [probe_support(coll, dtype, args.redop, g, control, device) for g in groups]
    if all(unsupported):
        raise RuntimeError(
            f"{PROG}: no backend runs {args.op} {args.dtype} {args.redop} on {args.device}: {unsupported}"
        )
    report = Report(args, world, coll, copy_bw, unsupported, gpu) if rank == 0 else None
    if report is not None:
        report.header()

    rows = []
    for size in size_sweep(args.minbytes, args.maxbytes, args.stepfactor):
        count = size // dtype.itemsize
        # Zeros stay zeros under every redop, so reducing the same buffer again and again neither
        # overflows nor turns denormal (which would slow the arithmetic); the check uses its own inputs.
        buf = torch.zeros(count, dtype=dtype, device=device)
        results = []
        for group, reason in zip(groups, unsupported, strict=True):
            if reason:
                results.append(Result(None, None))
                continue
            elapsed = time_collective(coll, buf, args, group, control)
            wrong = None
            if args.check:
                wrong = coll.check(count, dtype, args.redop, group, rank, world, device)
                wrong = _sum_over_ranks(wrong, control)
            results.append(Result(elapsed, wrong))
        rows.append((count * dtype.itemsize, count, results))
        if report is not None:
            report.row(*rows[-1])
    costs = None
    # Not where ringreduce is N/A (a build without CUDA, in CUDA mode): its bare group would fail too.
    if bare is not None and rows and not unsupported[0]:
        sizes = sorted({rows[0][0], rows[-1][0]})
        costs = safety_cost(args, dtype, sizes, groups[0], bare, control, device)
    if report is not None:
        report.summary(rows)
        report.headline(rows)
        if costs:
            report.safety(costs)
    if args.nccl_floor:
        # Rank 0's NCCL process has the GPU to itself: the other ranks wait here.
        if report is not None:
            report.nccl_floor(*nccl_floor(args, device, [nbytes for nbytes, _, _ in rows]))
        dist.barrier(group=control)
    if report is not None:
        if args.json:
            report.write_json(rows, args.json)
        if args.plot:
            report.plot(rows, args.plot)


# ---------------------------------------------------------------------------------------------------
# Output (rank 0)


def _fmt(value: float | None, spec: str) -> str:
    return "N/A" if value is None else format(value, spec)


class Report:
    """Prints the table as rows arrive, so a long run shows progress."""

    def __init__(
        self,
        args: argparse.Namespace,
        world: int,
        coll: Collective,
        copy_bw: float,
        unsupported: list,
        gpu: Gpu | None,
    ):
        self.args, self.world, self.coll, self.copy_bw, self.unsupported, self.gpu = (
            args,
            world,
            coll,
            copy_bw,
            unsupported,
            gpu,
        )
        # The memory floor's byte model (bytes, world) -> bytes, or None and why there is none.
        self.floor_bytes, self.no_floor = coll.floor_bytes, ""
        if gpu is not None:
            self.floor_bytes = coll.cuda_floor_bytes if gpu.shared else None
            if coll.cuda_floor_bytes is None:
                self.no_floor = f"no byte model of ringreduce's {coll.name} on CUDA"
            elif not gpu.shared:
                self.no_floor = (
                    f"the ranks are on {min(world, gpu.visible)} GPUs and the model is of one GPU's memory; "
                    "CUDA_VISIBLE_DEVICES=<one GPU> puts them all on one"
                )
        self.nccl: tuple | None = None  # nccl_floor's result, once measured
        self.names = args.backends
        self.groups = [("", [("size(B)", 12), ("count", 12), ("type", 8), ("redop", 6)])]
        for i, name in enumerate(self.names):
            cols = [("time(us)", 10), ("algbw(GB/s)", 11), ("busbw(GB/s)", 11), ("#wrong", 7)]
            if i == 0:
                cols += [("floor(us)", 10), ("%floor", 7)]
            self.groups.append((name, cols))
        if len(self.names) > 1:
            self.groups.append(("", [("ratio", 8)]))
        self.widths = [max(len(name), width) for _, cols in self.groups for name, width in cols]

    def _line(self, prefix: str, cells: list[str]) -> str:
        return prefix + " ".join(cell.rjust(w) for cell, w in zip(cells, self.widths, strict=True))

    def _busbw(self, nbytes: int, time_s: float) -> float:
        return nbytes / time_s / 1e9 * self.coll.busbw_factor(self.world)

    def _floor_s(self, nbytes: int) -> float | None:
        """The memory floor of one op of `nbytes`, in seconds; None where there is no model."""
        return None if self.floor_bytes is None else self.floor_bytes(nbytes, self.world) / self.copy_bw

    def _floor_lines(self, subject: str) -> list[str]:
        a, n, bw = self.args, self.world, f"{self.copy_bw / 1e9:.2f} GB/s"
        if self.gpu is None:
            return [
                f"Memory floor: {n} rank(s) each copying {format_size(copy_bytes(a.maxbytes))} at once move "
                f"{bw} (reads + writes, all ranks together)",
                f"  {subject}'s {a.op} of N bytes reads + writes {self.coll.floor_formula} bytes in all => "
                f"floor(us) = {self.coll.floor_formula} / {bw}; %floor = floor / time({subject})",
            ]
        g = self.gpu
        lines = [
            f"Copy bandwidth: {bw} device to device (dst.copy_(src) of {format_size(g.copy_bytes)}, "
            f"best of {COPY_TRIALS} runs of {GPU_REPS} copies timed with CUDA events; reads + writes)"
        ]
        if g.kernel_bw is None:
            lines.append(f"Kernel: ringreduce's reduction kernel not measured ({g.kernel_note})")
        else:
            share = g.kernel_bw / g.copy_bw
            kb = format_size(KERNEL_BYTES)
            lines.append(
                f"Kernel: ringreduce's reduction kernel (_C.reduce_tensors, float32 sum of two {kb} "
                f"buffers into a third) moves {g.kernel_bw / 1e9:.2f} GB/s (3 x {kb} per call) = "
                f"{share * 100:.1f}% of the copy bandwidth"
            )
        if self.floor_bytes is None:
            lines.append(f"Memory floor: N/A ({self.no_floor})")
        else:
            # The model is linear in N: its bytes for N = 1 are the coefficient.
            k = self.floor_bytes(1, n)
            lines += [
                f"Memory floor: {subject}'s {a.op} of N bytes moves {self.coll.cuda_floor_formula}/n bytes "
                "per rank through the GPU's memory (reads + writes, the ring's slots included)",
                f"  {n} rank(s) x {k}*N/{n} bytes each through one GPU's memory = {k}*N at {bw} => "
                f"floor(us) = {k}*N / {bw}; %floor = floor / time({subject})",
            ]
        return lines

    def header(self) -> None:
        a, n = self.args, self.world
        subject, baseline = self.names[0], self.names[1] if len(self.names) > 1 else None
        launch = (
            "launched by torchrun"
            if _launch.launched_by_torchrun()
            else f"spawned locally, {a.threads} intra-op thread(s) each"
        )
        lines = [
            f"{PROG}: {a.op}, {a.dtype}, redop {a.redop}",
            f"Command: {a.command}",
            f"Date: {datetime.datetime.now().isoformat(sep=' ', timespec='seconds')}",
            f"Host: {platform.node()}, {os.cpu_count()} CPUs, {platform.system()}-{platform.machine()}; "
            f"torch {torch.__version__}; Python {platform.python_version()}",
        ]
        if self.gpu is not None:
            g = self.gpu
            lines.append(
                f"Device: cuda:{g.index}, {g.name}; CUDA {torch.version.cuda}; {g.visible} GPU(s) visible, "
                f"rank r on GPU r % {g.visible}" + (", so every rank shares this one" if g.shared else "")
            )
        sync = "; CUDA: torch.cuda.synchronize() before every clock reading" if self.gpu is not None else ""
        lines += [
            f"World: {n} rank(s), {launch}",
            f"Timing: at each size, {a.warmup} untimed iterations, a barrier, then {a.iters} timed ones "
            f"or as many more as last {a.min_time:g} s (the same count on every rank); "
            f"time = max over ranks of the mean iteration time{sync}",
            f"Backends: {', '.join(self.names)}, alternating at each size; "
            "barriers and bookkeeping on a separate gloo group",
            f"algbw = size / time, busbw = algbw * {self.coll.busbw_formula} "
            f"({n} ranks: x{self.coll.busbw_factor(n):.3f}); GB = 1e9 bytes",
            *self._floor_lines(subject),
        ]
        if baseline:
            lines.append(f"ratio = busbw({subject}) / busbw({baseline}) = time({baseline}) / time({subject})")
        lines += [
            f"{name}: not measured ({reason})"
            for name, reason in zip(self.names, self.unsupported, strict=True)
            if reason
        ]
        if not a.check:
            lines.append("#wrong: not checked (--no-check)")
        for line in lines:
            print(f"# {line}")
        print("#")
        group_widths, first = [], 0
        for _, cols in self.groups:
            group_widths.append(sum(self.widths[first : first + len(cols)]) + len(cols) - 1)
            first += len(cols)
        group_line = " ".join(name.center(w) for (name, _), w in zip(self.groups, group_widths, strict=True))
        print(f"# {group_line.rstrip()}")
        print(self._line("# ", [name for _, cols in self.groups for name, _ in cols]), flush=True)

    def row(self, nbytes: int, count: int, results: list[Result]) -> None:
        a = self.args
        cells = [str(nbytes), str(count), a.dtype, a.redop]
        for i, r in enumerate(results):
            measured = r.time_s is not None
            cells += [
                _fmt(r.time_s * 1e6 if measured else None, ".1f"),
                _fmt(nbytes / r.time_s / 1e9 if measured else None, ".2f"),
                _fmt(self._busbw(nbytes, r.time_s) if measured else None, ".2f"),
                "N/A" if r.wrong is None else str(r.wrong),
            ]
            if i == 0:
                floor_s = self._floor_s(nbytes)
                if floor_s is None:
                    cells += ["N/A", "N/A"]
                else:
                    cells.append(f"{floor_s * 1e6:.1f}")
                    cells.append(
                        "-" if floor_s == 0 or r.time_s is None else f"{floor_s / r.time_s * 100:.1f}"
                    )
        if len(results) > 1:
            cells.append(_fmt(self._ratio(results), ".2f"))
        print(self._line("  ", cells), flush=True)

    def records(self, rows: list) -> list[dict]:
        """One dict per (size, backend): what the table shows, in plain units."""
        out = []
        for nbytes, count, results in rows:
            for name, r in zip(self.names, results, strict=True):
                measured = r.time_s is not None
                out.append({
                    "op": self.args.op, "backend": name, "device": self.args.device, "world": self.world,
                    "bytes": nbytes, "count": count, "dtype": self.args.dtype, "redop": self.args.redop,
                    "time_us": r.time_s * 1e6 if measured else None,
                    "algbw_GBps": nbytes / r.time_s / 1e9 if measured else None,
                    "busbw_GBps": self._busbw(nbytes, r.time_s) if measured else None,
                    "wrong": r.wrong,
                })
        return out

    def write_json(self, rows: list, path: str) -> None:
        doc = {
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": {"cpus": os.cpu_count(), "torch": torch.__version__},
            "copy_bandwidth_GBps": self.copy_bw / 1e9,
            "device": {"type": "cpu"},
            "rows": self.records(rows),
        }
        if self.gpu is not None:
            g = self.gpu
            doc["device"] = {"type": "cuda", "index": g.index, "name": g.name, "cuda": torch.version.cuda,
                             "gpus_visible": g.visible, "ranks_share_it": g.shared}
            doc["kernel_bandwidth_GBps"] = None if g.kernel_bw is None else g.kernel_bw / 1e9
        if self.nccl is not None:
            times, why = self.nccl
            doc["nccl_floor"] = (
                {"op": self.args.op, "world": 1, "rows": [{"bytes": n, "time_us": t * 1e6} for n, t in times]}
                if times is not None
                else {"not_measured": why}
            )
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"# wrote {path}")

    def plot(self, rows: list, path: str) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise RuntimeError(f"{PROG}: --plot needs matplotlib ({e}): pip install matplotlib") from e
        fig, ax = plt.subplots(figsize=(7, 4.5))
        recs = self.records(rows)
        for name in self.names:
            pts = [(r["bytes"], r["busbw_GBps"]) for r in recs if r["backend"] == name and r["busbw_GBps"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{name} {self.args.op}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{self.args.op}, {self.args.dtype} {self.args.redop}, {self.world} ranks")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        print(f"# wrote {path}")

    @staticmethod
    def _ratio(results: list[Result]) -> float | None:
        subject, baseline = results[0].time_s, results[1].time_s
        return None if subject is None or baseline is None else baseline / subject

    def safety(self, costs) -> None:
        parts = [f"{format_size(n)} {on * 1e6:.1f} us vs {off * 1e6:.1f} us without "
                 f"({(on / off - 1) * 100:+.1f}%)" for n, on, off in costs]
        print("# safety work (fingerprint check of every message + flight recorder), medians of "
              f"{SAFETY_ROUNDS} alternating runs: " + "; ".join(parts), flush=True)

    def summary(self, rows: list) -> None:
        """nccl-tests' closing lines for the first backend (and one line per other backend), then
        latency at the smallest size and busbw at the largest against the second backend."""
        self.nccl_lines(rows)
        if len(self.names) < 2 or any(self.unsupported[:2]):
            return
        subject, baseline = self.names[:2]
        small, large = rows[0], rows[-1]
        speedup = self._ratio(small[2])
        latency = f"1/{speedup:.3g} of" if speedup >= 1 else f"{1 / speedup:.3g}x"
        t0, t1 = (r.time_s * 1e6 for r in small[2][:2])
        size = format_size(small[0])
        print(f"# {size}: {subject} latency = {latency} {baseline} ({t0:.1f} us vs {t1:.1f} us)")
        nbytes, _, results = large
        bw0, bw1 = (self._busbw(nbytes, r.time_s) for r in results[:2])
        floor_s = self._floor_s(nbytes)
        at_floor = f", {floor_s / results[0].time_s * 100:.0f}% of the memory floor" if floor_s else ""
        print(
            f"# {format_size(nbytes)}: {subject} busbw = {self._ratio(results):.3g}x {baseline} "
            f"({bw0:.2f} vs {bw1:.2f} GB/s){at_floor}",
            flush=True,
        )

    def nccl_lines(self, rows: list) -> None:
        """`# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth : X`, as nccl-tests ends its
        output (scripts grep for them): the wrong elements summed over every size, and busbw averaged
        over every size, for the first backend; the other backends follow on a line each."""
        for i, name in enumerate(self.names):
            results = [r[2][i] for r in rows if r[2][i].time_s is not None]
            if not results:
                continue
            if not self.args.check:
                wrong = "not checked (--no-check)"
            else:
                n = sum(r.wrong or 0 for r in results)
                wrong = f"{n} {'OK' if n == 0 else 'FAILED'}"
            busbw = statistics.fmean(self._busbw(nbytes, res[i].time_s)
                                     for nbytes, _, res in rows if res[i].time_s is not None)
            if i == 0:
                print(f"# Out of bounds values : {wrong}")
                print(f"# Avg bus bandwidth    : {busbw:.4f} ")
            else:
                print(f"# {name}: out of bounds values {wrong}; avg bus bandwidth {busbw:.4f}")
        sys.stdout.flush()

    def headline(self, rows: list) -> None:
        """For ringreduce's all_reduce with its ranks on one GPU, at world size 2: a large op against
        the memory floor and gloo, and a small op's latency."""
        a = self.args
        if self.gpu is None or self.world != 2 or a.op != "all_reduce" or self.names[0] != "ringreduce":
            return
        subject = self.names[0]
        by_size = {nbytes: results for nbytes, _, results in rows}
        size = format_size(HEADLINE_LARGE_BYTES)
        big = by_size.get(HEADLINE_LARGE_BYTES)
        if big is not None and big[0].time_s is not None:
            t = big[0].time_s
            floor_s = self._floor_s(HEADLINE_LARGE_BYTES)
            if floor_s:
                print(f"# {size}: {subject} {t * 1e6:.1f} us = {t / floor_s:.2f}x the memory floor "
                      f"({floor_s * 1e6:.1f} us)")
            gloo = big[self.names.index("gloo")] if "gloo" in self.names[1:] else None
            if gloo is not None and gloo.time_s is not None:
                print(f"# {size}: {subject} busbw = {gloo.time_s / t:.3g}x gloo")
        small = by_size.get(HEADLINE_SMALL_BYTES)
        if small is not None and small[0].time_s is not None:
            print(f"# {format_size(HEADLINE_SMALL_BYTES)}: {subject} latency {small[0].time_s * 1e6:.1f} us")
        sys.stdout.flush()

    def nccl_floor(self, times: list | None, why: str | None) -> None:
        """NCCL's own time at world size 1 on this GPU: what launching any op costs, its floor."""
        self.nccl = (times, why)
        if times is None:
            print(f"# NCCL floor: not measured ({why})", flush=True)
            return
        print(f"# launch-overhead floor: NCCL {self.args.op} at world size 1 on the same GPU, in a process "
              "of its own (NCCL cannot put two ranks on one GPU), timed as the table is")
        print(f"# {'size(B)':>12} {'NCCL time(us)':>14}")
        for nbytes, t in times:
            print(f"# {nbytes:>12} {t * 1e6:>14.1f}")
        sys.stdout.flush()


# ---------------------------------------------------------------------------------------------------
# Entry point


def _cpus_available() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    args.command = shlex.join(["python", "-m", PROG, *argv])
    try:
        for name in set(args.backends):
            ensure_backend(name)
    except BackendUnavailable as e:
        sys.exit(f"{PROG}: error: {e}")

    if _launch.launched_by_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if args.nproc not in (None, world):
            sys.exit(f"{PROG}: error: -g {args.nproc} disagrees with torchrun's WORLD_SIZE={world}")
        # torchrun already chose the thread count (OMP_NUM_THREADS); leave it.
        args.threads = None
        run_rank(int(os.environ["RANK"]), world, None, args)
        return

    nproc = 2 if args.nproc is None else args.nproc
    # Share the cores among the local ranks: oversubscribed ranks would time the scheduler, and the
    # copy that measures the memory floor should use the whole machine once, not several times over.
    args.threads = max(1, _cpus_available() // nproc)
    sys.exit(_launch.spawn(run_rank, nproc, args.timeout, (args,), name=PROG))


if __name__ == "__main__":
    main()

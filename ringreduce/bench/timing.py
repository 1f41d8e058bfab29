"""The timing loop: how many iterations, how they are timed, and the figures every rank agrees on."""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .collectives import COLLECTIVES, Collective


@dataclass
class Result:
    """One backend's figures for one set at one size."""

    time_s: float | None  # None: the backend does not support this dtype and redop
    wrong: int | None  # None: not checked


@dataclass
class SetResults:
    """One backend at one size: nccl-tests' two sets."""

    out_of_place: Result
    in_place: Result

    def get(self, inplace: bool) -> Result:
        return self.in_place if inplace else self.out_of_place

    def both(self) -> tuple[Result, Result]:
        """In SETS' order."""
        return self.out_of_place, self.in_place


def _max_over_ranks(value: float, control) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control)
    return t.item()


def _sum_over_ranks(value: int, control) -> int:
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=control)
    return int(t.item())


def probe_support(
    coll: Collective, dtype: torch.dtype, redop: str, group, control, device: torch.device,
    inplace: bool | None = None,
) -> str | None:
    """Why this backend cannot run the collective's `inplace` set (its native set when None) with
    this dtype and redop on `device`, or None when it can.

    Backends reject an unsupported dtype, redop or device before communicating, identically on every
    rank, so catching the error here leaves the group usable; the ranks then agree through the
    control group.
    """
    if inplace is None:
        inplace = coll.native_in_place
    if inplace and coll.no_in_place:
        return coll.no_in_place  # the same on every rank: nothing to agree on
    try:
        buf = torch.zeros(1, dtype=dtype, device=device)
        coll.prepare(buf, redop, group, dist.get_world_size(group), inplace)().wait()
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


def _run_batch(run: Callable[[], object], n: int, blocking: bool, buf: torch.Tensor) -> None:
    """Issue `n` ops. Blocking (-z 1): each is waited on, and on a GPU finished, before the next is
    issued. Otherwise (-z 0), as nccl-tests without -z: all are issued, then all waited on."""
    if blocking:
        for _ in range(n):
            run().wait()
            _wait_for_device(buf)
    else:
        works = [run() for _ in range(n)]
        for work in works:
            work.wait()
    _wait_for_device(buf)


def time_collective(
    coll: Collective, buf: torch.Tensor, args: argparse.Namespace, group, control, inplace: bool | None = None
) -> float:
    """Max over ranks of the mean time of one iteration of the collective's `inplace` set (its
    native set when None), in seconds."""
    if inplace is None:
        inplace = coll.native_in_place
    run = coll.prepare(buf, args.redop, group, dist.get_world_size(group), inplace)
    _wait_for_device(buf)
    start = time.perf_counter()
    _run_batch(run, args.warmup, args.blocking, buf)
    # Every rank must run the same number of iterations: derive it from the slowest rank's warm-up.
    per_iter = _max_over_ranks((time.perf_counter() - start) / max(args.warmup, 1), control)
    iters = iterations(args, per_iter if args.warmup else 0.0)
    dist.barrier(group=control)
    _wait_for_device(buf)
    start = time.perf_counter()
    _run_batch(run, iters, args.blocking, buf)
    return _max_over_ranks((time.perf_counter() - start) / iters, control)


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

"""What each collective is to the benchmark: its dtypes and reductions, how to run it once, how to
check its result, nccl-tests' busbw factor, and the bytes ringreduce moves through memory for it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

# The program's name, as messages and the report's first line give it.
PROG = "ringreduce.bench"

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

# The correctness check builds its reference in float64 this many elements at a time, to bound memory.
CHECK_CHUNK = 1 << 20


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
    moves nothing. The stream-ordered one-shot that CUDA all-reduces take by default moves more per
    rank (its staging copy 2N, reading every rank's slot nN, writing N: (n+3)N), so this stays the
    floor: the less of the two, for every n.
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
    count: int, dtype: torch.dtype, redop: str, group, rank: int, world: int, device: torch.device,
    inplace: bool = True,
) -> int:
    """Run one all_reduce on known inputs on `device`; return how many of this rank's output
    elements are wrong. The float64 reference is built on the host, as the results are compared.
    Out of place, the op runs on a copy of the input, as the timed out-of-place form does."""
    signed = dtype.is_floating_point or dtype.is_signed
    buf = torch.empty(count, dtype=dtype, device=device)
    for lo in range(0, count, CHECK_CHUNK):
        idx = torch.arange(lo, min(lo + CHECK_CHUNK, count))
        buf[lo : lo + len(idx)] = check_input(redop, signed, world, rank, idx).to(dtype)
    if not inplace:
        buf = buf.clone()
    dist.all_reduce(buf, op=REDOPS[redop], group=group)
    wrong = 0
    for lo in range(0, count, CHECK_CHUNK):
        idx = torch.arange(lo, min(lo + CHECK_CHUNK, count))
        got = buf[lo : lo + len(idx)].to("cpu", torch.float64)
        wrong += _count_wrong(got, expected_result(redop, signed, world, idx), redop, dtype.is_floating_point)
    return wrong


# ---------------------------------------------------------------------------------------------------
# Collectives

# nccl-tests' two column sets, in its order: the result in a buffer of its own, and in the input's.
SETS = ("out-of-place", "in-place")


@dataclass(frozen=True)
class Collective:
    name: str
    # (buf, redop, group, world, inplace) -> a call that issues the collective once, asynchronously,
    # and returns its Work. `buf` holds the size being measured (the whole buffer, as nccl-tests
    # counts it); outputs are allocated here, once, so that allocation stays out of the timing.
    # Results are not checked.
    prepare: Callable[[torch.Tensor, str, object, int, bool], Callable[[], object]]
    # Runs it once on known inputs on a device:
    # (count, dtype, redop, group, rank, world, device, inplace) -> wrong elements here.
    check: Callable[..., int]
    busbw_factor: Callable[[int], float]
    busbw_formula: str
    # Bytes ringreduce reads plus writes machine-wide for one op of N bytes on n ranks, in the
    # native set (below).
    floor_bytes: Callable[[int, int], int]
    floor_formula: str
    # The same through one GPU's memory, for CUDA tensors with every rank on that GPU; None where
    # there is no model (the floor columns then read N/A).
    cuda_floor_bytes: Callable[[int, int], int] | None = None
    cuda_floor_formula: str = ""
    # The set that torch.distributed's own call is (all_reduce works in place, reduce_scatter_tensor
    # writes a buffer of its own): the floor, the ratio and the summary lines are about this one.
    native_in_place: bool = True
    # Why there is no in-place set, or "" when there is one.
    no_in_place: str = ""
    # What the set that is not native is, for the report's header.
    other_set: str = ""

    @property
    def native_set(self) -> str:
        return SETS[self.native_in_place]


def _copy_then(buf: torch.Tensor, issue: Callable[[torch.Tensor], object]) -> Callable[[], object]:
    """The out-of-place form of an op that torch.distributed has only in place: copy the input into
    a buffer of its own and run the op there, as a caller that keeps its input does; the time
    includes the copy. The copy first waits for the previous op, which may still be working on that
    buffer (with -z 0), so these ops overlap no more than the copy allows."""
    out = torch.empty_like(buf)  # owned by the returned call, for the whole measurement
    pending = []

    def run():
        if pending:
            pending.pop().wait()
        out.copy_(buf)
        work = issue(out)
        pending.append(work)
        return work

    return run


def _prepare_all_reduce(buf, redop, group, world, inplace):
    def issue(t):
        return dist.all_reduce(t, op=REDOPS[redop], group=group, async_op=True)

    return (lambda: issue(buf)) if inplace else _copy_then(buf, issue)


def _prepare_reduce_scatter(buf, redop, group, world, inplace):
    per = buf.numel() // world  # N is the input; each rank keeps N/n
    inp = buf[: per * world]
    if inplace:  # as nccl-tests: the output is this rank's chunk of the input
        rank = dist.get_rank(group)
        out = inp[rank * per : (rank + 1) * per]
    else:
        out = torch.empty(per, dtype=buf.dtype, device=buf.device)
    return lambda: dist.reduce_scatter_tensor(out, inp, op=REDOPS[redop], group=group, async_op=True)


def _prepare_all_gather(buf, redop, group, world, inplace):
    per = buf.numel() // world  # N is the output; each rank brings N/n
    out = buf[: per * world]
    if inplace:  # as nccl-tests: the input is this rank's chunk of the output
        rank = dist.get_rank(group)
        inp = out[rank * per : (rank + 1) * per]
    else:
        inp = buf[:per].clone()
    return lambda: dist.all_gather_into_tensor(out, inp, group=group, async_op=True)


def _prepare_broadcast(buf, redop, group, world, inplace):
    def issue(t):
        return dist.broadcast(t, src=0, group=group, async_op=True)

    return (lambda: issue(buf)) if inplace else _copy_then(buf, issue)


def _prepare_reduce(buf, redop, group, world, inplace):
    def issue(t):
        return dist.reduce(t, dst=0, op=REDOPS[redop], group=group, async_op=True)

    return (lambda: issue(buf)) if inplace else _copy_then(buf, issue)


def _prepare_alltoall(buf, redop, group, world, inplace):
    if inplace:
        raise ValueError(ALLTOALL_NO_IN_PLACE)
    n = buf.numel() // world * world  # N per rank, N/n to each peer
    inp = buf[:n]
    out = torch.empty_like(inp)
    return lambda: dist.all_to_all_single(out, inp, group=group, async_op=True)


ALLTOALL_NO_IN_PLACE = (
    "all_to_all_single has no in-place form: torch does not promise that its output may be its "
    "input, and gloo's result is wrong when it is"
)


def _data(dtype, signed, world, rank, idx):
    """Known values for the ops that only move data: exact in every dtype, different per rank."""
    return check_input("sum", signed, world, rank, idx).to(dtype)


# The check_* functions below run the op on `device` and compare on the host, where the expected
# values are built. `inplace` picks the set, built as the matching _prepare_* builds it.


def check_reduce_scatter(count, dtype, redop, group, rank, world, device, inplace=False):
    signed = dtype.is_floating_point or dtype.is_signed
    per = count // world
    inp = check_input(redop, signed, world, rank, torch.arange(per * world)).to(device, dtype)
    out = inp[rank * per : (rank + 1) * per] if inplace else torch.empty(per, dtype=dtype, device=device)
    dist.reduce_scatter_tensor(out, inp, op=REDOPS[redop], group=group)
    want = expected_result(redop, signed, world, torch.arange(rank * per, (rank + 1) * per))
    return _count_wrong(out.to("cpu", torch.float64), want, redop, dtype.is_floating_point)


def check_reduce(count, dtype, redop, group, rank, world, device, inplace=True):
    signed = dtype.is_floating_point or dtype.is_signed
    idx = torch.arange(count)
    buf = check_input(redop, signed, world, rank, idx).to(device, dtype)
    if not inplace:
        buf = buf.clone()  # the out-of-place form: the op runs on a copy of the input
    dist.reduce(buf, dst=0, op=REDOPS[redop], group=group)
    if rank != 0:
        return 0
    return _count_wrong(buf.to("cpu", torch.float64), expected_result(redop, signed, world, idx), redop,
                        dtype.is_floating_point)


def check_all_gather(count, dtype, redop, group, rank, world, device, inplace=False):
    signed = dtype.is_floating_point or dtype.is_signed
    per = count // world
    mine = _data(dtype, signed, world, rank, torch.arange(per)).to(device)
    out = torch.empty(per * world, dtype=dtype, device=device)
    if inplace:
        out[rank * per : (rank + 1) * per] = mine
        mine = out[rank * per : (rank + 1) * per]
    dist.all_gather_into_tensor(out, mine, group=group)
    want = torch.cat([_data(dtype, signed, world, q, torch.arange(per)) for q in range(world)])
    return int((out.cpu() != want).sum())


def check_broadcast(count, dtype, redop, group, rank, world, device, inplace=True):
    signed = dtype.is_floating_point or dtype.is_signed
    idx = torch.arange(count)
    buf = _data(dtype, signed, world, rank, idx).to(device)
    if not inplace:
        buf = buf.clone()  # the out-of-place form: the op runs on a copy of the input
    dist.broadcast(buf, src=0, group=group)
    return int((buf.cpu() != _data(dtype, signed, world, 0, idx)).sum())


def check_alltoall(count, dtype, redop, group, rank, world, device, inplace=False):
    if inplace:
        raise ValueError(ALLTOALL_NO_IN_PLACE)
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


# The out-of-place set of the ops torch.distributed has only in place (see _copy_then).
_COPIED = "the input is first copied into a buffer of its own, where {} runs, and the time includes the copy"

# Bytes that must cross main memory machine-wide for one op of N bytes on n ranks, in the native
# set (as for all_reduce, slots stay in cache): reduce_scatter reads N and writes N/n per rank;
# all_gather reads N/n and writes N per rank; broadcast's root reads N and every other rank writes
# N; reduce reads N on every rank and writes N on the root; alltoall reads and writes N per rank.
COLLECTIVES = {
    c.name: c
    for c in (
        Collective("all_reduce", _prepare_all_reduce, check_all_reduce, allreduce_busbw_factor,
                   "2(n-1)/n", ringreduce_allreduce_bytes, "2n*N", ringreduce_cuda_allreduce_bytes,
                   "(7n-5)*N", other_set=_COPIED.format("all_reduce")),
        Collective("reduce_scatter", _prepare_reduce_scatter, check_reduce_scatter,
                   _gather_scatter_factor, "(n-1)/n", lambda N, n: (n + 1) * N if n > 1 else 0,
                   "(n+1)*N", native_in_place=False,
                   other_set="in place, the output is this rank's chunk of the input, as in nccl-tests"),
        Collective("all_gather", _prepare_all_gather, check_all_gather, _gather_scatter_factor,
                   "(n-1)/n", lambda N, n: (n + 1) * N if n > 1 else 0, "(n+1)*N", native_in_place=False,
                   other_set="in place, the input is this rank's chunk of the output, as in nccl-tests"),
        Collective("broadcast", _prepare_broadcast, check_broadcast, lambda n: 1.0, "1",
                   lambda N, n: n * N if n > 1 else 0, "n*N", other_set=_COPIED.format("broadcast")),
        Collective("reduce", _prepare_reduce, check_reduce, lambda n: 1.0, "1",
                   lambda N, n: (n + 1) * N if n > 1 else 0, "(n+1)*N", other_set=_COPIED.format("reduce")),
        Collective("alltoall", _prepare_alltoall, check_alltoall, _gather_scatter_factor,
                   "(n-1)/n", lambda N, n: 2 * n * N if n > 1 else 0, "2n*N", native_in_place=False,
                   no_in_place=ALLTOALL_NO_IN_PLACE, other_set="no in-place set"),
    )
}

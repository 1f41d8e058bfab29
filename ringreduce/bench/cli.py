"""The command line and the driver: options, backends, the ranks' run, and the entry point."""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import pickle
import shlex
import sys
import tempfile

import torch
import torch.distributed as dist

from ringreduce import _launch

from .collectives import COLLECTIVES, DTYPES, PROG, REDOPS
from .cuda import measure_gpu, nccl_floor
from .floor import copy_bytes, measure_copy_bandwidth
from .report import Report
from ..sizes import size_arg, size_sweep
from .spread import Launch, Spread
from .timing import (
    SAFETY_OFF,
    Result,
    SetResults,
    _sum_over_ranks,
    probe_support,
    safety_cost,
    time_collective,
)

BUILD_HINT = "build it with `make build` or `pip install --no-build-isolation --no-deps -e .`"


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
    p.add_argument("-b", "--minbytes", type=size_arg, default="1K", help="smallest size (default 1K)")
    p.add_argument("-e", "--maxbytes", type=size_arg, default="64M", help="largest size (default 64M)")
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
        type=_bool_arg,
        nargs="?",
        const=True,
        default=True,
        metavar="0|1",
        help="count wrong result elements after each size and set: 1 (the default; -c alone too) or 0, "
        "when #wrong reads N/A, as in nccl-tests",
    )
    p.add_argument("--no-check", dest="check", action="store_false", help="the same as -c 0")
    p.add_argument(
        "-z",
        "--blocking",
        type=_bool_arg,
        default=False,
        metavar="0|1",
        help="1: wait for every op before issuing the next; 0 (default): issue a timed batch "
        "asynchronously and wait at its end, as nccl-tests does without -z",
    )
    p.add_argument(
        "--nccl-tests-columns",
        action="store_true",
        help="print nccl-tests' full column set: for every backend, time, algbw, busbw and #wrong of both "
        "the out-of-place and the in-place set (about 250 characters wide); by default each backend "
        "has the time and busbw of the collective's own set and #wrong over both sets, in 120 columns "
        "(the --launches spread table is the same either way)",
    )
    p.add_argument(
        "--launches",
        type=int,
        default=1,
        metavar="N",
        help="run each backend in N fresh launches of the ranks (new processes, new rendezvous), "
        "alternating between backends, and print each size's best, median and worst launch "
        "(default 1: one launch, every backend in the same processes, alternating at each size); "
        "not under torchrun",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds before a hung run (with --launches: a hung launch) is killed (default 600)",
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


def _bool_arg(text: str) -> bool:
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"expected 0 or 1, got {text!r}")
    return text == "1"


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
    if args.launches < 1:
        parser.error(f"--launches must be at least 1, got {args.launches}")
    if args.device == "cuda" and not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        parser.error(
            f"--device cuda needs a GPU, but torch.cuda.is_available() is False ({why}; "
            f"torch {torch.__version__})"
        )
    if args.nccl_floor is None:
        # A figure of the GPU, not of a launch: one run's worth says what it has to say.
        args.nccl_floor = args.device == "cuda" and args.launches == 1
    elif args.nccl_floor and args.device != "cuda":
        parser.error("--nccl-floor needs --device cuda")
    elif args.nccl_floor and args.launches > 1:
        parser.error("--nccl-floor runs with --launches 1 only")
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - checked now rather than after the whole run
        except ImportError:
            parser.error("--plot needs matplotlib: pip install matplotlib (or the 'plot' extra)")
    # Where one launch of several writes its figures for the parent; None: this run prints its own.
    args.launch_out = None
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
        "blocking",
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
        # The safety work's cost is a figure of a single run: one launch of several leaves it out.
        if args.backends[0] == "ringreduce" and args.op == "all_reduce" and args.launch_out is None:
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


def _bench(rank: int, world: int, args: argparse.Namespace, groups: list, control, bare=None) -> None:
    verify_same_plan(args, rank, world, control)
    # One launch of --launches N > 1: rank 0 hands its figures to the parent, which prints them all.
    quiet = args.launch_out is not None
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
    # Per backend, why it cannot run each set (SETS' order), or None where it can.
    unsupported = [tuple(probe_support(coll, dtype, args.redop, g, control, device, inplace)
                         for inplace in (False, True)) for g in groups]
    # A launch runs one backend; the parent tells whether any of them runs anything.
    if all(all(reasons) for reasons in unsupported) and not quiet:
        raise RuntimeError(
            f"{PROG}: no backend runs {args.op} {args.dtype} {args.redop} on {args.device}: {unsupported}"
        )
    report = Report(args, world, coll, copy_bw, unsupported, gpu) if rank == 0 and not quiet else None
    if report is not None:
        report.header()

    rows = []
    for size in size_sweep(args.minbytes, args.maxbytes, args.stepfactor):
        count = size // dtype.itemsize
        # Zeros stay zeros under every redop, so reducing the same buffer again and again neither
        # overflows nor turns denormal (which would slow the arithmetic); the check uses its own inputs.
        buf = torch.zeros(count, dtype=dtype, device=device)
        results = []
        for group, reasons in zip(groups, unsupported, strict=True):
            sets = []
            for inplace, reason in zip((False, True), reasons, strict=True):
                if reason:
                    sets.append(Result(None, None))
                    continue
                elapsed = time_collective(coll, buf, args, group, control, inplace)
                wrong = None
                if args.check:
                    wrong = coll.check(count, dtype, args.redop, group, rank, world, device, inplace)
                    wrong = _sum_over_ranks(wrong, control)
                sets.append(Result(elapsed, wrong))
            results.append(SetResults(*sets))
        rows.append((count * dtype.itemsize, count, results))
        if report is not None:
            report.row(*rows[-1])
    if quiet:
        if rank == 0:
            launch = {"rows": rows, "copy_bw": copy_bw, "gpu": gpu, "unsupported": unsupported[0]}
            with open(args.launch_out, "wb") as f:
                pickle.dump(launch, f)
        return
    costs = None
    # Not where ringreduce is N/A (a build without CUDA, in CUDA mode): its bare group would fail too.
    if bare is not None and rows and not unsupported[0][coll.native_in_place]:
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
        if args.launches > 1:
            sys.exit(
                f"{PROG}: error: --launches {args.launches} starts the ranks afresh for every launch, and "
                "under torchrun (env://) the ranks are torchrun's: a torchrun job cannot relaunch itself. "
                "Run without torchrun (-g N starts N local ranks), or run torchrun once per launch"
            )
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
    if args.launches > 1:
        sys.exit(run_launches(args, nproc))
    sys.exit(_launch.spawn(run_rank, nproc, args.timeout, (args,), name=PROG))


def run_launches(args: argparse.Namespace, nproc: int) -> int:
    """--launches N > 1: every backend in N launches of its own, each a fresh spawn of `nproc` ranks
    (a new rendezvous) that measures every size, in the order backend 1 launch 1, backend 2 launch 1,
    ..., backend 1 launch 2, ...; then the spread table. Returns an exit status."""
    launches = []
    with tempfile.TemporaryDirectory(prefix="ringreduce-bench-") as tmp:
        for number in range(1, args.launches + 1):
            for index, name in enumerate(args.backends):
                print(f"{PROG}: launch {number}/{args.launches} of {name}, {nproc} rank(s)", file=sys.stderr,
                      flush=True)
                one = copy.copy(args)
                one.backends = [name]
                one.launch_out = os.path.join(tmp, f"launch{number}-{index}.pickle")
                status = _launch.spawn(run_rank, nproc, args.timeout, (one,), name=PROG)
                if status != 0:
                    print(f"{PROG}: launch {number} of {name} failed; no table", file=sys.stderr)
                    return status
                with open(one.launch_out, "rb") as f:
                    launches.append(Launch(number=number, backend=index, **pickle.load(f)))
            if number == 1 and all(all(launch.unsupported) for launch in launches):
                print(
                    f"{PROG}: no backend runs {args.op} {args.dtype} {args.redop} on {args.device}: "
                    f"{[launch.unsupported for launch in launches]}",
                    file=sys.stderr,
                )
                return 1
    Spread(args, nproc, COLLECTIVES[args.op], launches).print()
    return 0

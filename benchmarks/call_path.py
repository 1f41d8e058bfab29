"""The cost of one small all-reduce along each path a PyTorch program calls it by: synchronous
`dist.all_reduce`, async with `wait()`, the functional collectives (DTensor's and torch.compile's
path), a compiled function, and ringreduce's direct op, eager and compiled; at world 1, 2 and 4.

    python benchmarks/call_path.py                     # worlds 1 2 4, 1 KiB fp32, inductor
    python benchmarks/call_path.py -g 2 --compile-backend aot_eager --calls 2000

The paths (each in place on one tensor of --bytes, sum over the default group, ringreduce's):

  sync          dist.all_reduce(t)
  async         dist.all_reduce(t, async_op=True).wait()
  functional    torch.ops._c10d_functional.all_reduce_(t, "sum", group) then wait_tensor(t)
  compiled      torch.compile(fullgraph=True) of a function that calls dist.all_reduce(t)
  compiled-mul  the same compiled wrapper around one in-place t.mul_(1.0) instead: what the
                compiled call costs without any collective
  direct        ringreduce.all_reduce_(t)
  direct-compiled  torch.compile(fullgraph=True) of a function that calls ringreduce.all_reduce_(t)
  sync-c++      the group's CPU backend's allreduce([t]) then wait(), looped in C++
                (ringreduce._C._time_backend_all_reduce_): the backend's own cost below torch's
                layers; beside the fake group's, what ringreduce's own code adds per op (at world 1,
                where nothing moves, all of it)
  async-c++     the same with asyncOp set, as the functional collectives and async_op=True pass it

The sync, async, functional and compiled paths are timed again on torch's fake process group
(`backend="fake"`), whose collectives return at once and move nothing: the "fake pg" column is what
torch itself costs along each path, and "rr-fake" what ringreduce adds to it (its own code and the
exchange).

How it is measured: every path is warmed up (and compiled) first, then --rounds rounds, the paths'
order rotated each round; in a round each path runs --calls calls after a barrier (on a gloo group
of its own), timed on each rank, the slowest rank's mean kept. A cell is the median over the rounds
(the least and the most in brackets). `compiled - mul` is the compiled call less the compiled
wrapper around one in-place op: what the collective adds inside compiled code. Each world's launch
carries the CPU probe of benchmarks/peers.py (a fixed pure-Python loop, ns per iteration; the
machine's CPU-slow state reads about 1.6x its best) before and after it. Each world closes with the
ratios of the async, functional and compiled paths to the synchronous one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # peers_cpu.py, beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_cpu  # noqa: E402
from ringreduce.sizes import size_arg  # noqa: E402

PATHS = ("sync", "async", "functional", "compiled", "compiled-mul", "direct", "direct-compiled",
         "sync-c++", "async-c++")
COMPILED = ("compiled", "compiled-mul", "direct-compiled")
# The paths also timed on torch's fake process group, whose collectives return at once: what torch
# itself costs along each, with a backend that does nothing.
ON_FAKE = ("sync", "async", "functional", "compiled", "sync-c++", "async-c++")


class Looped:
    """A path whose calls loop in C++: called once with the number of calls to make."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, n: int) -> None:
        self.fn(n)


def _run(call, n: int) -> None:
    if isinstance(call, Looped):
        call(n)
    else:
        for _ in range(n):
            call()


def _paths(t, group, backend: str | None, keys=PATHS):
    """{path: a call of it on t over `group`} for the paths in `keys`; the compiled ones compiled with
    `backend` (None: left out)."""
    import torch
    import torch.distributed as dist

    import ringreduce

    name = group.group_name

    def functional():
        torch.ops._c10d_functional.all_reduce_(t, "sum", name)
        torch.ops._c10d_functional.wait_tensor(t)

    calls = {
        "sync": lambda: dist.all_reduce(t, group=group),
        "async": lambda: dist.all_reduce(t, group=group, async_op=True).wait(),
        "functional": functional,
        "direct": lambda: ringreduce.all_reduce_(t, group=group),
        "sync-c++": Looped(lambda n: ringreduce._C._time_backend_all_reduce_(t, n, name, False)),
        "async-c++": Looped(lambda n: ringreduce._C._time_backend_all_reduce_(t, n, name, True)),
    }
    if backend is not None:
        def with_all_reduce(x):
            dist.all_reduce(x, group=group)
            return x

        def with_mul(x):
            x.mul_(1.0)
            return x

        def with_direct(x):
            ringreduce.all_reduce_(x, group=group)
            return x

        for key, fn in (("compiled", with_all_reduce), ("compiled-mul", with_mul), ("direct-compiled", with_direct)):
            if key in keys:
                compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=False)
                calls[key] = lambda compiled=compiled: compiled(t)
    return {k: calls[k] for k in keys if k in calls}


def _rank(rank: int, world: int, store, cfg: dict, out: str) -> None:
    """One rank: time every path, rounds with the order rotated; rank 0 writes the rows to `out`."""
    import torch
    import torch.distributed as dist

    import ringreduce  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world)
    control = dist.new_group(backend="gloo")
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)

    fake = dist.new_group(backend="fake")
    t = torch.zeros(cfg["bytes"] // 4)  # zeros: repeated in-place sums stay finite
    backend = None if cfg["compile_backend"] == "none" else cfg["compile_backend"]
    calls = _paths(t, dist.group.WORLD, backend)
    calls.update({f"fake:{k}": fn for k, fn in _paths(t, fake, backend, ON_FAKE).items()})

    def slowest(x: float) -> float:
        v = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX, group=control)
        return v.item()

    warm = {}
    for key, call in calls.items():
        dist.barrier(group=control)
        start = time.perf_counter()
        _run(call, cfg["warmup"])
        warm[key] = slowest(time.perf_counter() - start)
    keys = list(calls)
    times: dict = {k: [] for k in keys}
    for r in range(cfg["rounds"]):
        for key in keys[r % len(keys):] + keys[: r % len(keys)]:
            call = calls[key]
            dist.barrier(group=control)
            start = time.perf_counter()
            _run(call, cfg["calls"])
            times[key].append(slowest((time.perf_counter() - start) / cfg["calls"]))
    # The result, checked once: every rank adds rank + 1.
    t.fill_(rank + 1)
    dist.all_reduce(t)
    want = world * (world + 1) // 2
    if not bool((t == want).all()):
        raise RuntimeError(f"rank {rank}: the all-reduce gave {t[:4].tolist()}..., not {want}")
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"times": times, "warmup_s": warm}, f)
    dist.barrier(group=control)
    dist.destroy_process_group()


def measure(world: int, cfg: dict, timeout: float) -> dict:
    """One launch of `world` ranks: its times, with the CPU probe (peers_cpu.py) taken in as many
    processes as it has ranks (up to the cores) just before it and just after it."""
    from ringreduce import _launch

    probers = min(world, os.cpu_count() or 1)
    before = peers_cpu.cpu_probe_processes(probers)
    with tempfile.TemporaryDirectory(prefix="call-path-") as tmp:
        out = os.path.join(tmp, "rows.json")
        status = _launch.spawn(_rank, world, timeout, args=(cfg, out), name=f"call_path (world {world})")
        if status != 0:
            raise SystemExit(f"call_path: the launch at world {world} failed (status {status})")
        with open(out) as f:
            result = json.load(f)
    result["probe_ns"] = [before, peers_cpu.cpu_probe_processes(probers)]
    return result


def report(world: int, result: dict) -> list[str]:
    times = result["times"]
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    lines = [f"# world {world}" + (f" (CPU probe {result['probe_ns'][0]:.1f} ns before, {result['probe_ns'][1]:.1f} after)"
                                   if "probe_ns" in result else ""),
             f"#  {'path':<16} {'us/call':>9}  {'(least-most)':<16} {'x sync':>7}  {'fake pg':>8}  {'rr-fake':>8}  warm-up(s)"]
    for key in PATHS:
        if key not in times:
            continue
        spread = f"({min(times[key]) * 1e6:.2f}-{max(times[key]) * 1e6:.2f})"
        fake = med.get(f"fake:{key}")
        fake_cells = f"{fake:8.2f}  {med[key] - fake:8.2f}" if fake is not None else f"{'-':>8}  {'-':>8}"
        lines.append(f"   {key:<16} {med[key]:9.2f}  {spread:<16} {med[key] / med['sync']:7.2f}  {fake_cells}  "
                     f"{result['warmup_s'][key]:10.2f}")
    closing = (f"# call path, world {world}: async = {med['async'] / med['sync']:.2f}x sync, "
               f"functional = {med['functional'] / med['sync']:.2f}x sync")
    if "compiled" in med:
        added = med["compiled"] - med["compiled-mul"]
        fake = med.get("fake:compiled")
        fake_cells = f"{fake - med['compiled-mul']:8.2f}  {med['compiled'] - fake:8.2f}" if fake is not None else ""
        lines.append(f"   {'compiled - mul':<16} {added:9.2f}  {'':<16} {added / med['sync']:7.2f}  {fake_cells}")
        closing += f", compiled - mul = {added / med['sync']:.2f}x sync"
    closing += f"; sync {med['sync']:.2f} us, direct op {med['direct']:.2f} us"
    if "sync-c++" in med and "fake:sync-c++" in med:
        closing += (f"; in C++, ringreduce's backend adds {med['sync-c++'] - med['fake:sync-c++']:.2f} us sync, "
                    f"{med['async-c++'] - med['fake:async-c++']:.2f} async to the fake group's")
    return lines + [closing]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/call_path.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-g", "--nproc", type=int, nargs="+", default=[1, 2, 4], help="world sizes (default 1 2 4)")
    p.add_argument("--bytes", type=size_arg, default=1024, help="the tensor's size (default 1K)")
    p.add_argument("--calls", type=int, default=3000, help="timed calls per path and round (default 3000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds, the paths' order rotated each (default 5)")
    p.add_argument("--warmup", type=int, default=200, help="untimed calls per path first (default 200)")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend of the compiled paths: inductor (default), aot_eager, or none "
                        "to leave them out")
    p.add_argument("--timeout", type=float, default=900, help="seconds one world's launch may take (default 900)")
    p.add_argument("--json", metavar="FILE", help="also write every round's times here")
    args = p.parse_args(argv)
    if min(args.nproc) < 1 or args.calls < 1 or args.rounds < 1 or args.warmup < 1:
        p.error("world sizes, --calls, --rounds and --warmup must be at least 1")
    if args.bytes < 4 or args.bytes % 4:
        p.error(f"--bytes {args.bytes}: a whole number of floats")
    args.command = shlex.join(["python", os.path.relpath(os.path.abspath(__file__)), *argv])
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    import torch

    import ringreduce

    cfg = {"bytes": args.bytes, "calls": args.calls, "rounds": args.rounds, "warmup": args.warmup,
           "compile_backend": args.compile_backend}
    print(f"# all-reduce call paths: {args.bytes} bytes fp32, sum in place, ringreduce's default group")
    print(f"# {datetime.datetime.now().isoformat(timespec='seconds')}; {os.cpu_count()} cores; Python "
          f"{platform.python_version()}; torch {torch.__version__}, ringreduce {ringreduce.__version__}")
    print(f"# command: {args.command}")
    print(f"# timing: {args.warmup} untimed calls per path, then {args.rounds} rounds of {args.calls} calls per "
          "path, order rotated; a cell = the median round (the slowest rank's mean call), least-most in brackets; "
          f"compiled paths: torch.compile(fullgraph=True, backend={args.compile_backend!r})", flush=True)
    every = {}
    for world in args.nproc:
        result = measure(world, cfg, args.timeout)
        every[world] = result
        print("\n".join(report(world, result)), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": args.command, "worlds": every}, f)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The waiting rank's spin, A against B in the same processes: ranks that do some work of their own
between small all-reduces, as a compiled caller or a decode step does, on two ringreduce groups that
differ only in RINGREDUCE_SPIN_MAX_US.

    python benchmarks/spin_ab.py                          # world 2, work 80, 300 and 1000 us, 1000 vs 50
    python benchmarks/spin_ab.py --spin-max 1000 50 5000 --work 300

Each group is made with its RINGREDUCE_SPIN_MAX_US set while it is created (a group reads its knobs
then), so the settings share the processes, the cores and the minute. Between every two all-reduces
of --bytes each rank busy-waits the --work time, jittered by +-25% (a uniform draw per call, each
rank its own), so that ranks arrive apart as real callers do. --rounds rounds, each running --calls
calls on every group in turn (the order reversed every other round); a cell is the median round's
time per call less the mean work: what the all-reduce costs beyond the caller's own work, the
slowest rank's. Uniform jitter of +-25% alone makes the later of two ranks arrive about 8% of the
work after the mean, which no all-reduce can save. With more ranks than CPUs the spin starts at
1 us and a group's RINGREDUCE_SPIN_MAX_US is its limit all the same.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time

from ringreduce.sizes import size_arg

def _rank(rank: int, world: int, store, cfg: dict, out: str) -> None:
    import torch
    import torch.distributed as dist

    import ringreduce

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    groups = {}
    for value in cfg["spin_max"]:
        os.environ["RINGREDUCE_SPIN_MAX_US"] = str(value)
        groups[value] = dist.new_group(backend="ringreduce")
    os.environ.pop("RINGREDUCE_SPIN_MAX_US")
    t = torch.zeros(cfg["bytes"] // 4)
    rng = random.Random(rank)
    rows = {}
    for work in cfg["work"]:
        times: dict = {v: [] for v in groups}
        for r in range(cfg["rounds"]):
            order = list(groups) if r % 2 == 0 else list(groups)[::-1]
            for value in order:
                group = groups[value]
                for _ in range(cfg["warmup"]):
                    ringreduce.all_reduce_(t, group=group)
                dist.barrier()
                start = time.perf_counter()
                for _ in range(cfg["calls"]):
                    end = time.perf_counter() + work * (0.75 + 0.5 * rng.random()) * 1e-6
                    while time.perf_counter() < end:
                        pass
                    ringreduce.all_reduce_(t, group=group)
                per_call = (time.perf_counter() - start) / cfg["calls"]
                slowest = torch.tensor([per_call], dtype=torch.float64)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                times[value].append(slowest.item())
        rows[str(work)] = {str(v): times[v] for v in groups}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/spin_ab.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-g", "--nproc", type=int, default=2, help="ranks (default 2)")
    p.add_argument("--spin-max", type=int, nargs="+", default=[1000, 50],
                   help="RINGREDUCE_SPIN_MAX_US of each group, in us (default 1000 50)")
    p.add_argument("--work", type=int, nargs="+", default=[80, 300, 1000],
                   help="mean work between two calls, in us (default 80 300 1000)")
    p.add_argument("--bytes", type=size_arg, default=4096, help="the all-reduce's size (default 4K)")
    p.add_argument("--calls", type=int, default=2000, help="timed calls per group and round (default 2000)")
    p.add_argument("--rounds", type=int, default=8, help="rounds (default 8)")
    p.add_argument("--warmup", type=int, default=50, help="untimed calls before each timed run (default 50)")
    p.add_argument("--timeout", type=float, default=900, help="seconds the launch may take (default 900)")
    args = p.parse_args(argv)
    if (args.nproc < 2 or len(set(args.spin_max)) != len(args.spin_max) or min(args.spin_max) < 0
            or min(args.work) < 0 or args.calls < 1 or args.rounds < 1 or args.bytes < 4 or args.bytes % 4):
        p.error("need -g >= 2, distinct --spin-max values >= 0, --work >= 0, --calls and --rounds >= 1, "
                "--bytes a positive multiple of 4")
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    from ringreduce import _launch

    cfg = {k: getattr(args, k) for k in ("spin_max", "work", "bytes", "calls", "rounds", "warmup")}
    print(f"# spin A/B: world {args.nproc}, {args.bytes}-byte all-reduces (direct op), work between calls "
          f"jittered +-25%, {args.rounds} rounds of {args.calls} calls per group; us per call beyond the mean "
          "work, median round, the slowest rank's")
    with tempfile.TemporaryDirectory(prefix="spin-ab-") as tmp:
        out = os.path.join(tmp, "rows.json")
        status = _launch.spawn(_rank, args.nproc, args.timeout, args=(cfg, out), name="spin_ab")
        if status != 0:
            raise SystemExit(f"spin_ab: the launch failed (status {status})")
        with open(out) as f:
            rows = json.load(f)
    for work, by in rows.items():
        cells = [f"spin_max {v} us: {statistics.median(ts) * 1e6 - float(work):.1f}" for v, ts in by.items()]
        print(f"work {work} us: " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""The measurement behind the all-reduce crossover table (csrc/algo/select.cpp).

    python benchmarks/algo_sweep.py -g 2            # 2 local ranks, 1K..4M
    python benchmarks/algo_sweep.py -g 4 -b 4K -e 1M --rounds 7

Every algorithm runs in the same processes, forced in turn with the backend's set_algorithm at
each size, for several rounds with the order rotated each round; a cell is the median over rounds
of the slowest rank's mean time. Machines are noisy, so only the comparison within one run means
anything. The last column is the algorithm the table picks at that size ("auto"); "-" marks a size
larger than the shared window, which only the ring can carry.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys

import torch
import torch.distributed as dist

from ringreduce.bench import COLLECTIVES, format_size, size_arg, size_sweep, time_collective

ALGOS = ("ring", "oneshot", "twoshot")


def _time(t: torch.Tensor, iters: int, control) -> float:
    """The slowest rank's mean time of dist.all_reduce(t) over `iters` calls, after 5 untimed ones
    and a barrier: ringreduce.bench's loop, the count fixed here (the same for every algorithm)."""
    timing = argparse.Namespace(redop="sum", warmup=5, blocking=True, iters=iters, min_time=0)
    return time_collective(COLLECTIVES["all_reduce"], t, timing, dist.group.WORLD, control)


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    import ringreduce  # noqa: F401  (registers the backend)

    torch.set_num_threads(1)
    dist.init_process_group("ringreduce", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    control = dist.new_group(backend="gloo")
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    rows = []
    for nbytes in size_sweep(args.minbytes, args.maxbytes, args.stepfactor):
        t = torch.randn(nbytes // 4)
        iters = max(20, min(20000, int(args.seconds / max(nbytes / 2e9, 5e-6))))
        times = {a: [] for a in ALGOS}
        for r in range(args.rounds):
            for a in ALGOS[r % len(ALGOS):] + ALGOS[:r % len(ALGOS)]:
                dist.barrier(group=control)
                backend.set_algorithm(a)
                if backend.algorithm("allreduce", nbytes) != a:
                    continue  # larger than the window: the ring would run instead
                times[a].append(_time(t, iters, control))
        backend.set_algorithm("auto")
        rows.append((nbytes, {a: statistics.median(v) for a, v in times.items() if v},
                     backend.algorithm("allreduce", nbytes)))
    if rank == 0:
        queue.put((rows, backend.algorithms))
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-g", "--nproc", type=int, default=2)
    p.add_argument("-b", "--minbytes", type=size_arg, default=1 << 10)
    p.add_argument("-e", "--maxbytes", type=size_arg, default=4 << 20)
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.05, help="per measurement (default 0.05)")
    args = p.parse_args(argv)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 20000 + os.getpid() % 20000
    procs = [ctx.Process(target=_rank, args=(r, args.nproc, port, args, queue)) for r in range(args.nproc)]
    for proc in procs:
        proc.start()
    rows, crossovers = queue.get(timeout=3600)
    for proc in procs:
        proc.join()
    print(f"# ringreduce all-reduce by algorithm, float32 sum, {args.nproc} ranks on {os.cpu_count()} CPUs, "
          f"{datetime.date.today()}; median of {args.rounds} rounds, order rotated")
    print(f"# table in force: {crossovers}")
    print(f"{'size':>8} " + " ".join(f"{a + '(us)':>12}" for a in ALGOS) + f" {'fastest':>9} {'auto':>9}")
    for nbytes, t, auto in rows:
        best = min(t, key=t.get)
        cells = [f"{t[a] * 1e6:12.1f}" if a in t else f"{'-':>12}" for a in ALGOS]
        print(f"{format_size(nbytes):>8} " + " ".join(cells) + f" {best:>9} {auto:>9}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

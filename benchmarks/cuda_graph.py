"""Stream-ordered CUDA all-reduces called one by one against the same ops replayed from a CUDA graph,
in one run, on the ranks of one host (one GPU shared by all of them where there is only one).

    python benchmarks/cuda_graph.py                    # 2 ranks; 8K, 256K, 8M; 50 ops per batch
    python benchmarks/cuda_graph.py --nproc 4 --sizes 8K 1M --ops 20 --rounds 5

Per size, on every rank: a static fp32 tensor, one untimed all-reduce (the group's device set-up), a
graph that captured --ops in-place SUM all-reduces of it (torch.cuda.graph). Then --rounds rounds,
each a batch of --ops all-reduces called one by one (dist.all_reduce, as a training or decoding loop
calls them) and one replay of the graph, both between torch.cuda.synchronize() calls and after a
barrier on a gloo group. time = the median over rounds of the slowest rank's batch time / --ops. After
each batch, the tensor (all ones before it) is checked against world ** --ops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ringreduce.sizes import parse_size, format_size


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import ringreduce  # noqa: F401  (registers the backend)

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("ringreduce", rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    rows = []
    for size in args.sizes:
        x = torch.ones(size // 4, device="cuda")
        dist.all_reduce(x)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(args.ops):
                dist.all_reduce(x)
        times = {"eager": [], "graph": []}
        for _ in range(args.rounds):
            for how in ("eager", "graph"):
                x.fill_(1.0)
                torch.cuda.synchronize()
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                if how == "graph":
                    graph.replay()
                else:
                    for _ in range(args.ops):
                        dist.all_reduce(x)
                torch.cuda.synchronize()
                dt = torch.tensor([time.perf_counter() - t0])
                dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=gloo)
                times[how].append(dt.item() / args.ops)
                want = float(world) ** args.ops
                if want < 1e30 and not torch.allclose(x, torch.full_like(x, want), rtol=1e-5):
                    raise SystemExit(f"rank {rank}: {how}, {format_size(size)}: got {x.unique()[:4].tolist()}, "
                                     f"expected {want}")
        rows.append((size, statistics.median(times["eager"]), statistics.median(times["graph"])))
    if rank == 0:
        out.put(rows)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--sizes", nargs="+", type=parse_size, default=[parse_size(s) for s in ("8K", "256K", "8M")])
    p.add_argument("--ops", type=int, default=50, help="all-reduces per batch and per graph (default 50)")
    p.add_argument("--rounds", type=int, default=7, help="timed rounds (default 7)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("cuda_graph.py: no CUDA device")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.start_processes(_rank, args=(args.nproc, port, args, out), nprocs=args.nproc, start_method="spawn")
    rows = out.get()
    print(f"# ringreduce all_reduce, float32 sum, {args.nproc} ranks on {torch.cuda.get_device_name(0)} "
          f"({torch.cuda.device_count()} GPU(s) visible); {args.ops} ops per batch, median of {args.rounds} rounds")
    print(f"{'size':>8} {'called(us/op)':>14} {'replayed(us/op)':>16} {'called/replayed':>16}")
    for size, eager, graph in rows:
        print(f"{format_size(size):>8} {eager * 1e6:>14.1f} {graph * 1e6:>16.1f} {eager / graph:>16.2f}")


if __name__ == "__main__":
    main()

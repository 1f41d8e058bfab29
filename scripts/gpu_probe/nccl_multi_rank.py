"""NCCL with several ranks on one GPU, as the GPU probe's companion: prints the NCCL that torch
ships, and, where it is 2.30 or newer, times all_reduce (float32 sum) of 2 ranks on GPU 0 with
NCCL_MULTI_RANK_GPU_ENABLE=1, in the GPU probe's table format. Older NCCL refuses two ranks on one
GPU; then it says so and exits 0.

    python scripts/gpu_probe/nccl_multi_rank.py [--ranks 2] [--sizes 8K,256K,8M,256M]
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
    return int(float(s[:-1] if mult > 1 else s) * mult)


def human(b):
    for unit, m in (("M", 1 << 20), ("K", 1 << 10)):
        if b >= m and b % m == 0:
            return f"{b // m}{unit}"
    return str(b)


def worker(rank, world, sizes, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_MULTI_RANK_GPU_ENABLE="1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", 0))
    for b in sizes:
        x = torch.ones(b // 4, device="cuda")
        iters = max(10, min(2000, (1 << 31) // b))
        for _ in range(max(2, iters // 10)):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) * 1e6 / iters
        results.put((rank, b, us))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="8K,256K,8M,256M")
    args = ap.parse_args()
    version = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    print(f"# NCCL shipped with torch {torch.__version__}: {version}")
    if version is None:
        print("# no GPU: nothing to time")
        return 0
    if tuple(version) < (2, 30, 0):
        print("# NCCL older than 2.30: no several-ranks-per-GPU mode to compare with")
        return 0
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=worker, args=(r, args.ranks, sizes, port, results)) for r in range(args.ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
        if p.is_alive():
            p.kill()
    got = {}
    while not results.empty():
        rank, b, us = results.get()
        got[b] = max(got.get(b, 0.0), us)
    for b in sizes:
        us = got.get(b)
        cell = f"{us:10.1f}" if us is not None else f"{'-':>10}"
        print(f"{'nccl-multi':<12} {args.ranks:5d} {human(b):>7} {cell} {'-':>9} {'-':>7}  NCCL_MULTI_RANK_GPU_ENABLE=1")
    return 0 if len(got) == len(sizes) else 1


if __name__ == "__main__":
    sys.exit(main())

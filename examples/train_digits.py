"""Data-parallel training of a small MLP on scikit-learn's handwritten digits (8x8 images, ships
with scikit-learn, no download), with ringreduce or gloo and either DDP wrapper:

    torchrun --nproc-per-node 2 examples/train_digits.py --backend ringreduce --ddp ringreduce
    torchrun --nproc-per-node 2 examples/train_digits.py --backend gloo --ddp torch

Each rank trains on its share of the training set (DistributedSampler); the test set is split
the same way and the ranks' correct counts are summed with all_reduce. Rank 0 prints the test
accuracy (about 97% after 20 epochs).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def load_data(seed: int):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0  # pixel values are 0..16
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    n_test = len(x) // 5
    return TensorDataset(x[n_test:], y[n_test:]), TensorDataset(x[:n_test], y[:n_test])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="ringreduce", choices=["ringreduce", "gloo"])
    parser.add_argument("--ddp", default="ringreduce", choices=["ringreduce", "torch"],
                        help="ringreduce.DistributedDataParallel or torch's")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    dist.init_process_group(args.backend)  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()

    train, test = load_data(args.seed)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(args.seed + rank)  # different per rank: the wrapper broadcasts rank 0's
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
    if args.ddp == "ringreduce":
        from ringreduce import DistributedDataParallel
    else:
        from torch.nn.parallel import DistributedDataParallel
    ddp = DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=args.lr)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        for x, y in loader:
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()

    ddp.eval()
    # The test set split across ranks, each sample counted once: correct and seen.
    idx = torch.arange(rank, len(test), world)
    x, y = test.tensors[0][idx], test.tensors[1][idx]
    with torch.no_grad():
        counts = torch.tensor([int((ddp(x).argmax(1) == y).sum()), len(idx)], dtype=torch.int64)
    dist.all_reduce(counts)
    elapsed = time.perf_counter() - start
    if rank == 0:
        acc = counts[0].item() / counts[1].item()
        print(f"test accuracy: {100 * acc:.1f}% ({counts[0].item()}/{counts[1].item()}) after "
              f"{args.epochs} epochs; backend {args.backend}, {args.ddp} DDP, {world} ranks, "
              f"{elapsed:.1f} s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

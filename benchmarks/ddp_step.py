"""Training-step time of data parallelism on one host: ringreduce's DDP wrapper against torch's.

    python benchmarks/ddp_step.py                 # 2 ranks, an MLP of about 25M parameters
    python benchmarks/ddp_step.py -g 4 --batch 16

Every rank trains the same MLP (1024 -> 4096 -> 4096 -> 1024 by default: 25.2M parameters,
100 MB of fp32 gradients per step) with SGD, in eight ways, measured in the same run and
interleaved round by round (in an order rotated each round) so that a noisy neighbour hits them
alike:

  ringreduce DDP   ringreduce.DistributedDataParallel on the ringreduce group
  ..., views       the same with gradient_as_bucket_view=True (no copy in or out of the buckets)
  ..., overlap=False  the first without overlap: the buckets start when backward is done, which
                   shows what overlapping communication with backward gains or costs here
  torch DDP / rr   torch.nn.parallel.DistributedDataParallel on the ringreduce group
  torch DDP / gloo torch.nn.parallel.DistributedDataParallel on a gloo group
  no comm          the bare model: forward, backward and step, with no communication at all
                   (every rank still computes at once, so it shares the cores as the others do)
  no comm, in step the same, with a barrier before each step: the ranks then run the same phase
                   at the same time, as they do under DDP (whose all-reduces end together), so
                   their memory-bound phases (zeroing, the step, the page faults of new
                   gradients) compete; unsynchronised ranks drift apart and take turns instead
  bare + all-reduce the bare model, whose gradients are all-reduced (averaged, on the ringreduce
                   group, one op per gradient, last layer first) after backward and before the
                   step: no buckets, no hooks, no copies, no overlap; what the all-reduces cost
                   a step with no wrapper at all

Gradients are zeroed as ``optimizer.zero_grad()`` does by default (set to None, so autograd hands
over new tensors each step); ``--zero-grad zeros`` keeps them and writes zeros instead (then
autograd adds into them, and ``gradient_as_bucket_view`` needs no copy at all).

A step is forward + backward + optimizer step; its time is the slowest rank's median over the
rounds (each round's time per step is its steps' mean). The all-reduce of one step's gradients (one tensor of the same size) is timed alone on each backend, and
for ringreduce's wrapper the overlap is how much of that communication the step hides:
1 - (time the end of backward waited for all-reduces) / (the all-reduce alone).
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))


def _model(args, seed):
    import torch
    from torch import nn

    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(args.width_in, args.hidden), nn.ReLU(),
                         nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                         nn.Linear(args.hidden, args.width_in))


def _rank(rank, world, store, args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as TorchDDP

    import ringreduce

    torch.set_num_threads(args.threads)
    dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world)
    gloo = dist.new_group(backend="gloo")
    rr = dist.group.WORLD

    nparams = sum(p.numel() for p in _model(args, 0).parameters())

    default = ringreduce.DistributedDataParallel(_model(args, 0), process_group=rr,
                                                 bucket_cap_mb=args.bucket_mb)
    other = not default.overlap
    setups = {  # each its own copy of the same model
        "ringreduce DDP": default,
        "ringreduce DDP, views": ringreduce.DistributedDataParallel(
            _model(args, 0), process_group=rr, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=True),
        f"ringreduce DDP, overlap={other}": ringreduce.DistributedDataParallel(
            _model(args, 0), process_group=rr, bucket_cap_mb=args.bucket_mb, overlap=other),
        "torch DDP / rr": TorchDDP(_model(args, 0), process_group=rr, bucket_cap_mb=args.bucket_mb),
        "torch DDP / gloo": TorchDDP(_model(args, 0), process_group=gloo, bucket_cap_mb=args.bucket_mb),
        "no comm": _model(args, 0),
        "no comm, in step": _model(args, 0),
        "bare + all-reduce": _model(args, 0),
    }
    opts = {k: torch.optim.SGD(v.parameters(), lr=1e-3) for k, v in setups.items()}

    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, args.width_in, generator=g)
    y = torch.randn(args.batch, args.width_in, generator=g)

    set_to_none = args.zero_grad == "none"

    def step(name):
        model, opt = setups[name], opts[name]
        if name == "no comm, in step":
            dist.barrier(group=rr)
        opt.zero_grad(set_to_none=set_to_none)
        F.mse_loss(model(x), y).backward()
        if name == "bare + all-reduce":
            works = [dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=rr, async_op=True)
                     for p in reversed(list(model.parameters()))]
            for work in works:
                work.wait()
        opt.step()

    times = {k: [] for k in setups}
    waits = {k: [] for k in setups if isinstance(setups[k], ringreduce.DistributedDataParallel)}
    for name in setups:  # warm-up: first iterations allocate and (torch DDP) rebuild buckets
        for _ in range(args.warmup):
            step(name)
    names = list(setups)
    for r in range(args.rounds):
        # Each round starts one setup further on, so that none always runs first (after the
        # setup whose model was last in the caches) or always last.
        for name in names[r % len(names):] + names[:r % len(names)]:
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step(name)
                if name in waits:
                    waits[name].append(setups[name].overlap_record()["waited_s"])
            times[name].append((time.perf_counter() - t0) / args.steps)

    # One step's gradients all-reduced alone, per backend.
    comm = {}
    grad = torch.zeros(nparams)
    # gloo's Work handles of these all-reduces, held until the gloo group is gone (see the end).
    gloo_works = []

    def all_reduce(group):
        work = dist.all_reduce(grad, group=group, async_op=True)
        work.wait()
        if group is gloo:
            gloo_works.append(work)

    # Not ringreduce.bench.timing's loop: one step's all-reduce per sample, each after a barrier, the median.
    for label, group in (("ringreduce", rr), ("gloo", gloo)):
        for _ in range(2):
            all_reduce(group)
        samples = []
        for _ in range(args.rounds):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            all_reduce(group)
            samples.append(time.perf_counter() - t0)
        comm[label] = statistics.median(samples)

    # The slowest rank's median, per setup.
    wait_names = list(waits)
    mine = torch.tensor([statistics.median(times[k]) for k in setups]
                        + [statistics.median(waits[k]) for k in wait_names]
                        + [comm["ringreduce"], comm["gloo"]], dtype=torch.float64)
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=rr)
    # What overlapping did in the last step, from the setup that overlaps.
    record = (default if default.overlap else setups[f"ringreduce DDP, overlap={other}"]).overlap_record()
    if rank == 0:
        n = len(setups)
        _report(args, world, nparams, default.overlap, dict(zip(setups, mine[:n].tolist())),
                dict(zip(wait_names, mine[n:n + len(wait_names)].tolist())),
                {"ringreduce": mine[-2].item(), "gloo": mine[-1].item()}, record)
    dist.barrier(group=rr)  # every rank done with every group before any tears one down
    dist.destroy_process_group()
    # torch's gloo group joins its worker threads when it is destroyed, holding the GIL of the
    # thread that drops it. A worker that is still releasing its last op then waits for that GIL
    # when the op held the last reference to a tensor Python also knows (`grad` here): a deadlock
    # (torch's github issue 56297; it hung this benchmark). So the gloo group goes first (with torch's
    # DDP, which holds it, and our names for it) while `gloo_works` still holds those ops, whose
    # workers then only drop a reference that is not the last; the ops go after, on this thread.
    setups.clear()
    del gloo, group
    gc.collect()  # torch's DDP module may sit in a reference cycle
    gloo_works.clear()


def _report(args, world, nparams, overlap, step, waited, comm, record):
    base = step["torch DDP / gloo"]
    print(f"# {world} ranks, MLP {args.width_in}-{args.hidden}-{args.hidden}-{args.width_in}: "
          f"{nparams / 1e6:.1f}M parameters ({nparams * 4 / 1e6:.0f} MB of fp32 gradients), batch "
          f"{args.batch} per rank, {args.threads} thread(s) per rank, buckets of {args.bucket_mb:g} MB, "
          f"gradients zeroed with zero_grad(set_to_none={args.zero_grad == 'none'})")
    print(f"# step = forward + backward + SGD step; slowest rank's median of {args.rounds} rounds x "
          f"{args.steps} steps; setups interleaved round by round, in an order rotated each round")
    print(f"# all-reduce of one step's gradients alone: ringreduce {comm['ringreduce'] * 1e3:.1f} ms, "
          f"gloo {comm['gloo'] * 1e3:.1f} ms")
    print("# overhead = step - no comm (copies into and out of buckets, communication, the cores "
          "they take from backward, and ranks stepping in lockstep); comm hidden = 1 - (wait at the end of backward) / (all-reduce "
          "alone), known for ringreduce's wrapper only")
    print(f"{'setup':<29} {'step(ms)':>9} {'samples/s':>10} {'vs torch DDP/gloo':>18} "
          f"{'overhead(ms)':>13} {'comm hidden':>12}")
    for name, t in step.items():
        thru = world * args.batch / t
        overhead = f"{(t - step['no comm']) * 1e3:.1f}" if not name.startswith("no comm") else "-"
        hidden = "-"
        if name in waited:
            hidden = f"{100 * max(0.0, 1 - waited[name] / comm['ringreduce']):.0f}%"
        print(f"{name:<29} {t * 1e3:9.1f} {thru:10.0f} {t / base:17.2f}x {overhead:>13} {hidden:>12}")
    for name in ("ringreduce DDP", "ringreduce DDP, views"):
        ratio = step[name] / base
        print(f"# {name}: step = {ratio:.2f}x torch DDP on gloo")
    other = f"ringreduce DDP, overlap={not overlap}"
    gain = step[other] - step["ringreduce DDP"]
    print(f"# overlap: ringreduce DDP's step (overlap={overlap}) is {abs(gain) * 1e3:.1f} ms "
          f"{'shorter' if gain >= 0 else 'longer'} than with overlap={not overlap}")
    lockstep = step["no comm, in step"] - step["no comm"]
    print(f"# lockstep: the bare model with a barrier before each step is {abs(lockstep) * 1e3:.1f} ms "
          f"{'slower' if lockstep >= 0 else 'faster'} than without: what stepping together does to a step "
          "before any communication")
    bare = step["bare + all-reduce"]
    above = step["ringreduce DDP"] - bare
    print(f"# no wrapper: the bare model with its gradients all-reduced after backward is {bare / base:.2f}x "
          f"torch DDP on gloo; ringreduce DDP's step is {abs(above) * 1e3:.1f} ms "
          f"{'longer' if above >= 0 else 'shorter'}")
    starts = record["ready_when_started"]
    print(f"# last overlapped ringreduce DDP step: {len(starts)} buckets; gradients ready when each started: "
          f"{starts} of {record['params']}; all-reduces done before the last gradient: "
          f"{record['completed_before_last_gradient']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-g", "--nproc", type=int, default=2, help="ranks (default 2)")
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--width-in", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=3, help="steps per round and setup")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--zero-grad", choices=("none", "zeros"), default="none",
                        help="none: zero_grad() as torch's default (gradients set to None); zeros: "
                        "zero_grad(set_to_none=False)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads per rank (default: the CPUs divided among the ranks)")
    parser.add_argument("--timeout", type=float, default=1200)
    args = parser.parse_args(argv)
    if args.threads <= 0:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.nproc)
    sys.path.insert(0, os.path.dirname(_HERE))
    from ringreduce import _launch

    return _launch.spawn(_rank, args.nproc, args.timeout, (args,), name="ddp_step")


if __name__ == "__main__":
    sys.exit(main())

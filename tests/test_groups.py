"""Groups made from groups: ProcessGroup.split_group (ringreduce says supports_splitting),
dist.new_subgroups and new_subgroups_by_enumeration, with several of them used at once; barrier
with device_ids."""

from datetime import timedelta

import pytest

import harness


def _rank_split(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures = []
    backend = ctx.group._get_backend(torch.device("cpu"))
    if not backend.supports_splitting:
        failures.append("supports_splitting is False")
    # Two halves (listed out of order: new ranks are numbered in ascending order, as torch's
    # split_group registers them), then every rank but the last, which gets no group. Each new
    # group needs a name of its own: it scopes the group's keys in the store.
    halves = [[1, 0], [3, 2]] if n == 4 else [[0, 1], [2]]
    mine = next(h for h in halves if r in h)
    sub = ctx.group.split_group(mine, timeout=timedelta(seconds=60),
                                group_name=f"halves-{min(mine)}-{ctx.seed}")
    if sub is None or sub.size() != len(mine) or sub.rank() != sorted(mine).index(r):
        failures.append(f"split {mine}: got size {sub and sub.size()}, rank {sub and sub.rank()}")
    head = list(range(n - 1))
    part = ctx.group.split_group(head, timeout=timedelta(seconds=60), group_name=f"head-{ctx.seed}")
    if (part is None) != (r == n - 1):
        failures.append(f"split {head}: rank {r} got {part!r}")
    # Both new groups and the parent, interleaved and all async.
    works = []
    for i in range(5):
        a = torch.full((10_000,), float(r + i))
        works.append((sub.allreduce([a]), a, float(sum(q + i for q in mine)), "halves"))
        if part is not None:
            b = torch.full((777,), float(r * i))
            works.append((part.allreduce([b]), b, float(sum(q * i for q in head)), "head"))
        c = torch.full((5,), 1.0)
        works.append((dist.all_reduce(c, async_op=True), c, float(n), "parent"))
    for w, t, want, name in works:
        w.wait()
        if not torch.equal(t, torch.full_like(t, want)):
            failures.append(f"all_reduce on {name}: got {t[0].item()}, expected {want}")
    # A split's backend is a ringreduce one and splits again.
    sub_backend = sub._get_backend(torch.device("cpu"))
    if sub_backend.name() != "ringreduce":
        failures.append(f"the split's backend is {sub_backend.name()}")
    if len(mine) > 1:
        again = sub.split_group([0], timeout=timedelta(seconds=60), group_name=f"again-{ctx.seed}-{mine[0]}")
        if (again is None) != (sub.rank() != 0):
            failures.append(f"split of a split: rank {sub.rank()} got {again!r}")
        if again is not None:
            t = torch.ones(3)
            again.allreduce([t]).wait()
            if not torch.equal(t, torch.ones(3)):
                failures.append("all_reduce on a one-rank split changed the tensor")
    return failures, {}


def test_split_group(ranks, standin):
    if standin:
        pytest.skip("a split that leaves a rank out hangs gloo's members (torch 2.13); "
                    "this test is for ringreduce's split")
    harness.check_results(ranks(4).run(_rank_split, timeout=120))


def _rank_subgroups(ctx, backend):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures = []
    cur, groups = dist.new_subgroups(group_size=2, backend=backend)
    if dist.get_world_size(cur) != 2 or dist.get_rank(cur) != r % 2:
        failures.append(f"new_subgroups: size {dist.get_world_size(cur)}, rank {dist.get_rank(cur)}")
    odd_even, _ = dist.new_subgroups_by_enumeration([[0, 2], [1, 3]], backend=backend)
    t = torch.tensor([float(r)])
    u = torch.tensor([float(r)])
    w1 = dist.all_reduce(t, group=cur, async_op=True)
    w2 = dist.all_reduce(u, group=odd_even, async_op=True)
    w1.wait()
    w2.wait()
    pair = [r - r % 2, r - r % 2 + 1]
    if t.item() != sum(pair):
        failures.append(f"new_subgroups all_reduce: {t.item()} expected {sum(pair)}")
    if u.item() != (0 + 2 if r % 2 == 0 else 1 + 3):
        failures.append(f"new_subgroups_by_enumeration all_reduce: {u.item()}")
    # Broadcast from each subgroup's second rank (a global rank) and gather within the other.
    b = torch.tensor([float(r * 10)])
    dist.broadcast(b, src=pair[1], group=cur)
    if b.item() != pair[1] * 10:
        failures.append(f"broadcast in a subgroup: {b.item()}")
    objs = [None, None]
    dist.all_gather_object(objs, r, group=odd_even)
    if objs != ([0, 2] if r % 2 == 0 else [1, 3]):
        failures.append(f"all_gather_object in a subgroup: {objs}")
    for g in groups:
        dist.destroy_process_group(g)
    return failures, {}


def test_new_subgroups(ranks, backend):
    harness.check_results(ranks(4).run(_rank_subgroups, backend, timeout=120))


def _rank_barrier_device_ids(ctx):
    import torch.distributed as dist

    # device_ids name accelerator devices; for a CPU group the barrier is the same barrier.
    dist.barrier(device_ids=[0])
    dist.barrier(device_ids=[0], async_op=True).wait()
    return [], {}


def test_barrier_with_device_ids(ranks):
    harness.check_results(ranks(2).run(_rank_barrier_device_ids, timeout=60))

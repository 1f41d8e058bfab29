"""What torch's own suite asks of a gloo-like backend beyond the common collectives, at world
size 4: sparse COO all_reduce (SUM, as gloo), all_gather_coalesced's layout, monitored_barrier
naming the ranks that did not arrive, a timed-out barrier saying so, and the dtypes that errors
list being the dtypes that work.
"""

import pytest

import harness

WORLD = 4

# --------------------------------------------------------------------------------------
# what torch's own suite asks of a gloo-like backend


def _rank_sparse_all_reduce(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures, digests = [], {}
    # (shape, sparse dims, non-zeros per rank): a different count on each rank, a hybrid tensor
    # (dense trailing dims), an empty one, overlapping indices across ranks.
    cases = [((50,), 1, 7 + 3 * r), ((20, 30), 2, 40 * r), ((16, 4, 3), 1, 5 + r), ((10, 10), 2, 0)]
    for k, (shape, sdim, nnz) in enumerate(cases):
        g = ctx.gen("sparse", k, rank=r)
        idx = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sdim)])
        vals = torch.randn((nnz, *shape[sdim:]), generator=g, dtype=torch.float64).float()
        x = torch.sparse_coo_tensor(idx, vals, shape)
        mine, oracle = x.clone(), x.clone()
        w = dist.all_reduce(mine, async_op=(k % 2 == 1))
        if w is not None:
            w.wait()
        dist.all_reduce(oracle, group=ctx.gloo)
        name = f"sparse {shape} sparse_dim={sdim}"
        if not mine.is_sparse or not mine.is_coalesced():
            failures.append(f"{name}: the result is not a coalesced sparse tensor")
            continue
        if not torch.allclose(mine.to_dense(), oracle.to_dense(), rtol=1e-5, atol=1e-5):
            failures.append(f"{name}: differs from gloo's")
        digests[name] = harness.digest(mine.to_dense())
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.AVG):
        try:
            dist.all_reduce(torch.sparse_coo_tensor(torch.zeros(1, 1, dtype=torch.long),
                                                    torch.ones(1), (3,)), op=op)
            failures.append(f"sparse all_reduce with {op} did not fail")
        except RuntimeError as e:
            if "SUM only" not in str(e):
                failures.append(f"sparse all_reduce with {op}: {e}")
    return failures, digests


def test_sparse_all_reduce_sum_like_gloo(ranks, backend):
    harness.check_results(ranks(WORLD).run(_rank_sparse_all_reduce, timeout=120))


def _rank_all_gather_coalesced(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    ins = [torch.full((2, 2), float(r)), torch.tensor([r * 10.0]), torch.tensor([r, r + 1.0])]
    got = {}
    for g, which in ((None, "ringreduce"), (ctx.gloo, "gloo")):
        out = [[torch.full_like(t, -1) for t in ins] for _ in range(n)]
        dist.all_gather_coalesced(out, ins, group=g)
        got[which] = [[t.tolist() for t in lst] for lst in out]
    return got


def test_all_gather_coalesced_layout_like_gloo(ranks, backend):
    for got in ranks(WORLD).run(_rank_all_gather_coalesced, timeout=60):
        assert got["ringreduce"] == got["gloo"], got


def _rank_monitored_barrier(ctx, absent, wait_all):
    import datetime

    import torch.distributed as dist

    import ringreduce

    g = dist.new_group(backend=ctx.backend)
    try:
        if ctx.rank in absent:
            return None
        ringreduce.monitored_barrier(g, timeout=datetime.timedelta(seconds=1),
                                     wait_all_ranks=wait_all)
        return "passed"
    except RuntimeError as e:
        return str(e)
    finally:
        dist.destroy_process_group(g)


def test_monitored_barrier_names_the_ranks_that_did_not_arrive(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce.monitored_barrier reaches the backend's own monitoredBarrier")
    pool = ranks(WORLD)
    assert pool.run(_rank_monitored_barrier, (), False, timeout=60) == ["passed"] * WORLD
    got = pool.run(_rank_monitored_barrier, (2,), False, timeout=60)
    assert "Rank 2 failed to pass monitoredBarrier in 1000 ms" in got[0], got
    assert all("not released by rank 0" in got[r] for r in (1, 3)), got
    got = pool.run(_rank_monitored_barrier, (1, 3), True, timeout=60)
    assert "Ranks 1, 3 failed to pass monitoredBarrier in 1000 ms" in got[0], got
    assert "not released by rank 0" in got[2], got


def _rank_barrier_timeout(ctx):
    import datetime
    import re

    import torch.distributed as dist

    g = dist.new_group(backend=ctx.backend, timeout=datetime.timedelta(seconds=1))
    res = None
    if ctx.rank == 0:
        try:
            dist.barrier(g)
            res = "the barrier passed"
        except RuntimeError as e:
            # What torch's own suite, and scripts, look for in a timed-out barrier's error.
            res = None if re.search(" (Timed out|closed|timeout) ", str(e)) else str(e)
    dist.barrier(group=ctx.gloo)  # rank 1 keeps its group until rank 0 has timed out
    dist.destroy_process_group(g)
    return res


def test_a_timed_out_barrier_says_timed_out(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("checks ringreduce's message")
    pool = ranks(2)
    assert pool.run(_rank_barrier_timeout, timeout=60) == [None, None]


DTYPE_LIST_WORKER = r'''
import json, os, re
import torch
import torch.distributed as dist
import ringreduce  # noqa: F401
dist.init_process_group("ringreduce")
every = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
# The backend itself: torch's all_reduce would hand it a complex tensor as real pairs.
be = dist.group.WORLD._get_backend(torch.device("cpu"))
ok, refused, listed = [], {}, set()
for dt in every:
    try:
        t = torch.zeros(4, dtype=dt)
    except Exception:
        continue  # a dtype torch cannot make a dense CPU tensor of
    try:
        be.allreduce([t]).wait()
        ok.append(str(dt).replace("torch.", ""))
    except RuntimeError as e:
        refused[str(dt)] = str(e)
        m = re.search(r"is not supported \(supported: ([^)]*)\)", str(e))
        if m:
            listed.add(m.group(1))
with open(os.path.join(os.environ["OUT"], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"ok": ok, "refused": refused, "listed": sorted(listed)}, f)
os._exit(0)
'''


def test_the_supported_dtypes_in_errors_are_the_dtypes_that_work(tmp_path, backend):
    """Every torch dtype tried at world 1: the ones refused all say the same list of supported
    dtypes, and that list is exactly the ones that went through (it is made from the dtype list
    the kernels dispatch on, not typed into the error)."""
    if backend != "ringreduce":
        pytest.skip("ringreduce's own error text")
    results, _, why = harness.launch_script_ranks(tmp_path, 1, DTYPE_LIST_WORKER, "dtypes", {})
    r = results[0]
    assert len(r["listed"]) == 1, why  # one list, whatever dtype was refused
    listed = r["listed"][0].split(", ")
    assert sorted(listed) == sorted(r["ok"]), why
    assert r["refused"] and all("is not supported" in e for e in r["refused"].values()), why
    assert {"float32", "bfloat16", "complex128", "bool"} <= set(listed), why

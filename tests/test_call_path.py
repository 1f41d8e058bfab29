"""Where an async op runs: on the caller's thread when it is small and nothing is ahead of it, or
when its wait() finds it not started; on the group's progress thread otherwise
(RINGREDUCE_INLINE_ASYNC_BYTES, csrc/backend/backend_collectives.cpp and work.cpp).

- The same inputs give the same bits synchronously, async run inline, async run by the waiting
  thread, and async run on the progress thread (a wait with a timeout leaves it there), for every
  kind of dtype and several ops and sizes on either side of the inline limit.
- A small async op issued while nothing is queued returns completed; with the limit at 0 the
  same op goes through the queue and completes at its wait().
- Async ops issued back to back and waited for in reverse order all complete, in issue order, with
  the right results (the waiting thread runs the ones queued before its own).
"""

import datetime
import os

import pytest

import harness
import reference


def _group(env):
    import torch.distributed as dist

    # Rank 0's environment when the group is made is what the group agrees on (Config::agree).
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return dist.new_group(backend="ringreduce")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _rank_same_bits(ctx):
    import torch.distributed as dist

    r, n = ctx.rank, ctx.world_size
    inline = _group({"RINGREDUCE_INLINE_ASYNC_BYTES": "256K"})
    queued = _group({"RINGREDUCE_INLINE_ASYNC_BYTES": "0"})
    failures = []
    for dtype_name in ("float32", "bfloat16", "float64", "int32", "uint8", "complex64"):
        for op in ("SUM", "AVG", "MAX"):
            if op not in reference.ops_for(dtype_name) or (dtype_name == "complex64" and op == "MAX"):
                continue
            for count in (1, 1009, 70001, 300007):
                x = reference.make_input(ctx.gen("async", dtype_name, op, count, rank=r), dtype_name,
                                         count, op, n)
                red = reference.reduce_op(op)
                got = {}

                def run(name, fn):
                    t = x.clone()
                    fn(t)
                    got.setdefault(harness.digest(t), []).append(name)

                run("sync", lambda t: dist.all_reduce(t, op=red, group=inline))
                run("async", lambda t: dist.all_reduce(t, op=red, group=inline, async_op=True).wait())
                run("async, queued, run by wait",
                    lambda t: dist.all_reduce(t, op=red, group=queued, async_op=True).wait())
                run("async, progress thread",
                    lambda t: dist.all_reduce(t, op=red, group=queued, async_op=True).wait(
                        timeout=datetime.timedelta(seconds=60)))
                if len(got) != 1:
                    failures.append(f"{dtype_name} {op} count={count}: rank {r}: {list(got.values())}")
    for g in (inline, queued):
        dist.destroy_process_group(g)
    return failures, {}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_inline_waited_and_threaded_async_ops_give_the_same_bits(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    harness.check_results(ranks(world).run(_rank_same_bits, timeout=600))


def _rank_where(ctx):
    import torch
    import torch.distributed as dist

    inline = _group({"RINGREDUCE_INLINE_ASYNC_BYTES": "4K"})
    queued = _group({"RINGREDUCE_INLINE_ASYNC_BYTES": "0"})
    failures = []
    small = torch.ones(256)
    w = dist.all_reduce(small, group=inline, async_op=True)
    if not w.is_completed():
        failures.append(f"rank {ctx.rank}: a 1 KiB async op with nothing queued was not run inline")
    w.wait()
    big = torch.ones(4096)  # 16 KiB, over the limit
    w = dist.all_reduce(big, group=inline, async_op=True)
    w.wait()
    w = dist.all_reduce(small, group=queued, async_op=True)
    w.wait()
    if not w.is_completed():
        failures.append(f"rank {ctx.rank}: wait() returned before the op completed")
    n = ctx.world_size
    if not (torch.equal(small, torch.full((256,), float(n * n))) and torch.equal(big, torch.full((4096,), float(n)))):
        failures.append(f"rank {ctx.rank}: wrong sums")
    # Issued back to back, waited for in reverse: the last one's wait runs every op before it.
    for g in (inline, queued):
        ts = [torch.full((50000,), float(ctx.rank + k)) for k in range(6)]
        works = [dist.all_reduce(t, group=g, async_op=True) for t in ts]
        for w in reversed(works):
            w.wait()
        for k, t in enumerate(ts):
            want = float(sum(p + k for p in range(n)))
            if not torch.equal(t, torch.full((50000,), want)):
                failures.append(f"rank {ctx.rank}: op {k} of six waited in reverse is wrong")
    for g in (inline, queued):
        dist.destroy_process_group(g)
    return failures, {}


@pytest.mark.parametrize("world", [1, 2])
def test_where_async_ops_run(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    harness.check_results(ranks(world).run(_rank_where, timeout=120))

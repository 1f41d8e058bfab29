"""The stream-ordered CUDA all-reduce (backend/cuda_ordered.h): queued at the call and ordered
between the ranks by the GPU, with NCCL's stream semantics.

Skipped, with the reason, where there is no GPU or ringreduce was built without CUDA (the CUDA
sources still compile in every CI run). On a GPU host (scripts/gpu_check.sh), ranks share one GPU:
- every dtype and op through a 4 KiB window, so that tensors go in many chunks and both staging
  slots alternate, against the float64 reference and bit-identical across ranks; the ring (window
  0) on the same sweep, so that both paths stay right;
- wait() returns while the op still runs, and orders the caller's stream after it;
- a rank that dies before its part of an op leaves its peer with an error that names the op and
  the dead rank, its tensor as it was, and no GPU hang;
- all-reduces captured in a CUDA graph replay right between eager ones; what cannot be captured
  (a group's first op, an average) is refused with a clear error, and the group goes on; a replay
  waiting for a dead peer is released;
- ranks whose calls disagree (different counts) both fail with an error that says so, and write
  nothing.
"""

import os
import time

import pytest

import harness
from reference import DTYPE_NAMES
from test_cuda import _REASON, _device, _rank_allreduce_sweep

pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

CHUNKED_COUNTS = [1, 1023, 4097, 100_003]


@pytest.fixture
def ringreduce_only(backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's CUDA path")


@pytest.mark.parametrize("world,window", [(2, "4K"), (4, "4K"), (2, "0")])
def test_ordered_all_reduce_in_chunks_and_the_ring(ranks, ringreduce_only, world, window):
    pool = ranks(world, env={"RINGREDUCE_CUDA_WINDOW_BYTES": window})
    harness.check_results(pool.run(_rank_allreduce_sweep, DTYPE_NAMES, CHUNKED_COUNTS, timeout=600))


def _rank_wait_is_stream_ordered(ctx):
    import torch
    import torch.distributed as dist

    dev = _device(ctx)
    n = ctx.world_size
    x = torch.full((1 << 20,), float(ctx.rank + 1), device=dev)
    dist.all_reduce(x, group=ctx.group)  # the device transport's set-up, out of the way
    torch.cuda.synchronize()
    dist.barrier(group=ctx.gloo)
    x.fill_(float(ctx.rank + 1))
    # The caller's stream stays busy for a while (~0.1 s) before the op's input is ready.
    torch.cuda._sleep(200_000_000)  # sleep-ok: GPU busy time (cycles), no host wait
    work = dist.all_reduce(x, group=ctx.group, async_op=True)
    t0 = time.perf_counter()
    work.wait()
    waited_us = (time.perf_counter() - t0) * 1e6
    done_at_wait = work.is_completed()
    got = x.clone()  # queued on the caller's stream right after wait(): must see the result
    torch.cuda.synchronize()
    failures = []
    if done_at_wait:
        failures.append("work.is_completed() was already True after wait(), with the GPU busy for "
                        "~0.1 s more: wait() blocked the host until the op ended")
    want = float(n * (n + 1) // 2)
    if not torch.all(got == want):
        failures.append(f"read right after wait(): {got.unique()[:5].tolist()}, expected {want}")
    if not work.is_completed():
        failures.append("work.is_completed() is False after torch.cuda.synchronize()")
    return failures, {}


@pytest.mark.parametrize("world", [2, 4])
def test_wait_orders_the_callers_stream_and_returns(ranks, ringreduce_only, world):
    harness.check_results(ranks(world).run(_rank_wait_is_stream_ordered, timeout=300))


def _graph_inputs(rank, step, count, dtype):
    """Rank `rank`'s input at replay `step`: small integers, so that every sum and product is exact
    and any rank can compute every other's."""
    import torch

    g = torch.Generator().manual_seed(1000 * step + 17 * rank + count)
    return torch.randint(-3, 4, (count,), generator=g).to(dtype)


def _rank_captured_and_eager(ctx):
    """A graph of three all-reduces (one of an odd number of chunks with a 4 KiB window) and a
    kernel between them, replayed several times with fresh inputs, each replay between eager
    all-reduces of an odd number of chunks: so the staging slots' turn at a replay differs from the
    one at capture."""
    import torch
    import torch.distributed as dist

    dev = _device(ctx)
    n = ctx.world_size
    ops = [(1023, torch.float32, dist.ReduceOp.SUM), (4097, torch.float32, dist.ReduceOp.SUM),
           (300, torch.int32, dist.ReduceOp.MAX)]
    static = [torch.zeros(c, dtype=d, device=dev) for c, d, _ in ops]
    # Warm-up outside the capture, as torch advises: the group's device set-up, and each kernel's
    # first launch (its module's loading).
    for t, (_, _, op) in zip(static, ops):
        dist.all_reduce(t, op=op, group=ctx.group)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(static[0], op=ops[0][2], group=ctx.group)
        static[1].mul_(2)
        dist.all_reduce(static[1], op=ops[1][2], group=ctx.group)
        dist.all_reduce(static[2], op=ops[2][2], group=ctx.group)
    failures = []
    eager = torch.zeros(3000, device=dev)  # 3 chunks of the 4 KiB window
    for step in range(4):
        eager.copy_(_graph_inputs(ctx.rank, 100 + step, 3000, torch.float32))
        dist.all_reduce(eager, group=ctx.group)
        want_eager = sum(_graph_inputs(r, 100 + step, 3000, torch.float32) for r in range(n))
        for t, (c, d, _) in zip(static, ops):
            t.copy_(_graph_inputs(ctx.rank, step, c, d))
        graph.replay()
        got = [t.cpu() for t in static]
        ins = [[_graph_inputs(r, step, c, d) for r in range(n)] for c, d, _ in ops]
        want = [sum(ins[0]), sum(x * 2 for x in ins[1]), torch.stack(ins[2]).amax(0)]
        for k, (g, w) in enumerate(zip(got, want)):
            if not torch.equal(g, w):
                bad = int((g != w).sum())
                failures.append(f"replay {step}, captured op {k}: {bad} of {g.numel()} elements wrong")
        if not torch.equal(eager.cpu(), want_eager):
            failures.append(f"step {step}: the eager all-reduce before the replay is wrong")
    return failures, {}


@pytest.mark.parametrize("world,window", [(2, "4K"), (4, "4K"), (2, None)])
def test_captured_all_reduces_replay_among_eager_ones(ranks, ringreduce_only, world, window):
    pool = ranks(world, env={"RINGREDUCE_CUDA_WINDOW_BYTES": window}) if window else ranks(world)
    harness.check_results(pool.run(_rank_captured_and_eager, timeout=300))


def _rank_capture_refusals(ctx):
    import torch
    import torch.distributed as dist

    dev = _device(ctx)
    n = ctx.world_size
    failures = []

    def refused(what, call, words):
        graph = torch.cuda.CUDAGraph()
        msg = None
        try:
            with torch.cuda.graph(graph):
                call()
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            msg = str(e)
        if msg is None:
            failures.append(f"{what}: captured without an error")
        elif not all(w in msg for w in words + [f"rank {ctx.rank}"]):
            failures.append(f"{what}: the error does not say what and where: {msg[:300]}")

    # A new group's first CUDA op sets up device memory: not inside a capture.
    fresh = dist.new_group(backend="ringreduce")
    x = torch.ones(1024, device=dev)
    refused("the group's first op", lambda: dist.all_reduce(x, group=fresh), ["first CUDA op", "capture"])
    # An average takes the ring, which waits on the host.
    dist.all_reduce(x, group=ctx.group)
    torch.cuda.synchronize()
    refused("an average", lambda: dist.all_reduce(x, op=dist.ReduceOp.AVG, group=ctx.group),
            ["CUDA graph", "allreduce"])
    x.fill_(1.0)
    dist.all_reduce(x, group=ctx.group)
    dist.all_reduce(x, group=fresh)
    torch.cuda.synchronize()
    if not torch.all(x == n * n):
        failures.append(f"after the refused captures, two all-reduces gave {x.unique()[:5].tolist()}")
    dist.destroy_process_group(fresh)
    return failures, {}


def test_capture_is_refused_clearly_where_it_cannot_work(ranks, ringreduce_only):
    harness.check_results(ranks(2).run(_rank_capture_refusals, timeout=300))


DISAGREEING_WORKER = r"""
import json, os, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ringreduce  # noqa: F401
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
warm = torch.ones(8, device="cuda")
dist.all_reduce(warm)
torch.cuda.synchronize()
# Counts differ, and so do the numbers of turns (4 KiB window): rank 1 waits in its second turn for
# a post rank 0 never makes, until its watchdog releases it.
x = torch.full((1000 * (rank + 1),), float(rank + 1), device="cuda")
before = x.clone()
t0 = time.time()
err = None
try:
    work = dist.all_reduce(x, async_op=True)
    while not work.is_completed() and time.time() - t0 < 40:
        time.sleep(0.01)  # sleep-ok: polling the op's end, as a user would
    work.wait()
except Exception as e:  # noqa: BLE001
    err = str(e)
torch.cuda.synchronize()  # must return: the watchdog released the device's waits
res = {"err": err, "unchanged": bool(torch.equal(x, before)), "secs": time.time() - t0}
with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
os._exit(0)
"""


def test_ranks_whose_calls_disagree_fail_and_write_nothing(tmp_path, ringreduce_only):
    results, _, why = harness.launch_script_ranks(tmp_path, 2, DISAGREEING_WORKER, "cuda-disagree",
                                                  {"RINGREDUCE_CUDA_WINDOW_BYTES": "4K"}, timeout=120)
    assert sorted(results) == [0, 1], why
    for r, res in results.items():
        assert res["err"], f"rank {r}'s all-reduce of a different count did not fail\n{why}"
        assert "different all-reduces" in res["err"] and "1000 elements" in res["err"] \
            and "2000 elements" in res["err"] and f"rank {r}" in res["err"], why
        assert res["unchanged"], f"the failed op changed rank {r}'s tensor\n{why}"
        assert res["secs"] < 30, why


REPLAY_KILLED_WORKER = r"""
import json, os, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ringreduce  # noqa: F401
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
x = torch.full((1 << 12,), float(rank + 1), device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    dist.all_reduce(x)
x.fill_(float(rank + 1))
graph.replay()
torch.cuda.synchronize()
first = x[0].item()
dist.barrier()
if rank == 1:
    with open(os.path.join(os.environ["OUT"], "rank1.json"), "w") as f:
        json.dump({"first": first}, f)
    os._exit(0)  # dies before its part of the next replay
x.fill_(5.0)
t0 = time.time()
graph.replay()
torch.cuda.synchronize()  # must return: the watchdog released the replay's waits
secs = time.time() - t0
err = None
try:
    dist.all_reduce(x)
except Exception as e:  # noqa: BLE001
    err = str(e)
res = {"first": first, "secs": secs, "unchanged": bool(torch.all(x == 5.0)), "err": err}
with open(os.path.join(os.environ["OUT"], "rank0.json"), "w") as f:
    json.dump(res, f)
os._exit(0)
"""


def test_a_replay_waiting_for_a_dead_peer_is_released(tmp_path, ringreduce_only):
    results, _, why = harness.launch_script_ranks(tmp_path, 2, REPLAY_KILLED_WORKER, "cuda-replay-kill", {},
                                                  timeout=120)
    assert sorted(results) == [0, 1], why
    assert results[0]["first"] == 3.0 and results[1]["first"] == 3.0, why
    r0 = results[0]
    assert r0["secs"] < 20, f"the replay waited {r0['secs']:.1f} s for the dead rank\n{why}"
    assert r0["unchanged"], f"the released replay changed rank 0's tensor\n{why}"
    assert r0["err"] and "rank 1" in r0["err"], f"the next op did not name the dead rank\n{why}"


KILLED_WORKER = r"""
import json, os, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ringreduce  # noqa: F401
rank = int(os.environ["RANK"])
out = os.environ["OUT"]
torch.cuda.set_device(0)
dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
x = torch.full((1 << 16,), float(rank + 1), device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
dist.barrier()
if rank == 1:
    with open(os.path.join(out, "rank1.json"), "w") as f:
        json.dump({"died": True}, f)
    os._exit(0)  # dies before its part of the next op
before = x.clone()
t0 = time.time()
err = None
try:
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    while not work.is_completed() and time.time() - t0 < 40:
        time.sleep(0.01)  # sleep-ok: polling the op's end, as a user would
    work.wait()  # raises the op's error once it has failed
except Exception as e:  # noqa: BLE001
    err = str(e)
torch.cuda.synchronize()  # must return: the watchdog released the device's waits
res = {"err": err, "unchanged": bool(torch.equal(x, before)), "secs": time.time() - t0}
with open(os.path.join(out, "rank0.json"), "w") as f:
    json.dump(res, f)
os._exit(0)
"""


def test_a_rank_that_dies_fails_its_peers_op_without_a_gpu_hang(tmp_path, ringreduce_only):
    results, _, why = harness.launch_script_ranks(tmp_path, 2, KILLED_WORKER, "cuda-kill", {}, timeout=120)
    assert 0 in results, why
    r0 = results[0]
    assert r0["err"], f"the op of rank 0 did not fail although rank 1 died\n{why}"
    assert "allreduce" in r0["err"] and "rank 1" in r0["err"], why
    assert r0["unchanged"], f"the failed op changed rank 0's tensor\n{why}"
    assert r0["secs"] < 30, f"rank 0 learned of rank 1's death after {r0['secs']:.1f} s\n{why}"

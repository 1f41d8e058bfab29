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
- an all-reduce inside CUDA graph capture is refused with a clear error, and the group goes on.
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


@pytest.mark.parametrize("window", ["4K", "0"])
def test_ordered_all_reduce_in_chunks_and_the_ring(ranks, ringreduce_only, window):
    pool = ranks(2, env={"RINGREDUCE_CUDA_WINDOW_BYTES": window})
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


def _rank_graph_capture(ctx):
    import torch
    import torch.distributed as dist

    dev = _device(ctx)
    n = ctx.world_size
    x = torch.ones(1024, device=dev)
    dist.all_reduce(x, group=ctx.group)
    torch.cuda.synchronize()
    failures = []
    graph = torch.cuda.CUDAGraph()
    msg = None
    try:
        with torch.cuda.graph(graph):
            dist.all_reduce(x, group=ctx.group)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        msg = str(e)
    if msg is None:
        failures.append("an all-reduce was captured in a CUDA graph without an error")
    elif not ("CUDA graph" in msg and "allreduce" in msg and f"rank {ctx.rank}" in msg):
        failures.append(f"the capture's error does not say what and where: {msg[:300]}")
    x.fill_(1.0)
    dist.all_reduce(x, group=ctx.group)
    torch.cuda.synchronize()
    if not torch.all(x == n):
        failures.append(f"after the refused capture, an all-reduce gave {x.unique()[:5].tolist()}")
    return failures, {}


def test_graph_capture_is_refused_clearly(ranks, ringreduce_only):
    harness.check_results(ranks(2).run(_rank_graph_capture, timeout=300))


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

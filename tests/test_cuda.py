"""CUDA tensors through ringreduce: its own kernels and transports, several ranks on one GPU.

Skipped, with the reason, where there is no GPU or ringreduce was built without CUDA (the C++
kernels still compile in every CI run: CMakeLists.txt builds csrc/reduce/*.cu).

On a GPU host (scripts/gpu_check.sh runs this file there), world sizes 2 and 4 share one GPU:
- all_reduce of every dtype x op x count {0, 1, 7, 1009, 2^20+3}, in place, against the float64
  (exact for integers) reference rebuilt from every rank's seed, bit-identical across ranks, and
  beside gloo on the same CUDA tensors for the ops gloo has; a 256 MiB + 5-element float32 sum;
- async ops issued from a non-default stream whose input is produced on that stream, read
  right after work.wait() and then overwritten (the result must be the op's, not a race);
- broadcast, all_gather (tensor and list), reduce_scatter, reduce, gather, scatter,
  all_to_all_single, barrier, send/recv and object collectives on the same group;
- the kernels alone (ringreduce._C.reduce_tensors) against torch, every dtype and op;
- torch's DDP and ringreduce.DistributedDataParallel training on CUDA, against torch's DDP on
  gloo.
"""

import hashlib

import pytest

import harness
import reference
from reference import DTYPE_NAMES


def _skip_reason():
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        return f"torch cannot be imported: {e}"
    if not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False)"
    try:
        from ringreduce import _build_info
    except ImportError as e:
        return f"ringreduce cannot be imported: {e}"
    if not getattr(_build_info, "WITH_CUDA", False):
        return f"ringreduce was built without CUDA ({getattr(_build_info, 'CUDA_NOTE', '?')})"
    return None


_REASON = _skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

COUNTS = [0, 1, 7, 1009, 2**20 + 3]
BIG = 64 * 2**20 + 5  # 256 MiB of float32, and an odd tail


def _device(ctx):
    import torch

    d = torch.device("cuda", ctx.rank % torch.cuda.device_count())
    torch.cuda.set_device(d)
    return d


def _digest(t):
    return hashlib.sha1(t.detach().cpu().contiguous().view(-1).view(__import__("torch").uint8).numpy()
                        .tobytes()).hexdigest()[:16]


def _inputs(ctx, case, dtype_name, count, op):
    return [reference.make_input(ctx.gen("in", case, rank=r), dtype_name, count, op, ctx.world_size)
            for r in range(ctx.world_size)]


def _rank_allreduce_sweep(ctx, dtype_names, counts):
    import torch.distributed as dist

    dev = _device(ctx)
    failures, digests = [], {}
    n = ctx.world_size
    k = 0
    for dtype_name in dtype_names:
        for op in reference.ops_for(dtype_name):
            for count in counts:
                case = f"world={n} dtype={dtype_name} op={op} count={count}"
                factor = 0.5 + (k % 3) if op == "PREMUL_SUM" else None
                ins = _inputs(ctx, case, dtype_name, count, op)
                x = ins[ctx.rank].to(dev)
                try:
                    if dtype_name in reference.COMPLEX_NAMES and op == "PRODUCT":
                        opts = dist.AllreduceOptions()
                        opts.reduceOp = dist.ReduceOp.PRODUCT
                        ctx.group.allreduce([x], opts).wait()
                    else:
                        dist.all_reduce(x, op=reference.reduce_op(op, factor), group=ctx.group)
                    out = x.cpu()  # syncs the current stream, which waits for the op
                except Exception as e:  # noqa: BLE001 - the case's failure is the result
                    failures.append(f"{case}: raised {type(e).__name__}: {e}")
                    k += 1
                    continue
                digests[case] = _digest(out)
                if k % n == ctx.rank:  # the checking rank rotates over the cases
                    ref = reference.reference(ins, dtype_name, op, factor)
                    scale = None if reference.exact_kind(dtype_name, op) else reference.float_scale(ins, dtype_name, op, factor)
                    bad = reference.compare(out, ref, dtype_name, op, scale)
                    if bad:
                        failures.append(f"{case}: {bad}")
                k += 1
    return failures, digests


def _rank_beside_gloo(ctx):
    """ringreduce and gloo on the same CUDA inputs, for the dtypes and ops gloo has on CUDA."""
    import torch
    import torch.distributed as dist

    dev = _device(ctx)
    failures, digests = [], {}
    for dtype_name, op in [("float32", "SUM"), ("float32", "MAX"), ("int64", "SUM"),
                           ("int32", "MIN"), ("float64", "PRODUCT")]:
        for count in (1, 1009, 2**20 + 3):
            case = f"gloo world={ctx.world_size} {dtype_name} {op} {count}"
            ins = _inputs(ctx, case, dtype_name, count, op)
            x = ins[ctx.rank].to(dev)
            y = x.clone()
            dist.all_reduce(x, op=getattr(dist.ReduceOp, op), group=ctx.group)
            dist.all_reduce(y, op=getattr(dist.ReduceOp, op), group=ctx.gloo)
            # The two sum in different orders: the tolerance scales with sum |x_i|, as against
            # the reference.
            scale = None if reference.exact_kind(dtype_name, op) else reference.float_scale(ins, dtype_name, op)
            bad = reference.compare(x.cpu(), y.cpu().to(torch.float64) if dtype_name.startswith("float")
                                  else y.cpu(), dtype_name, op, scale, slack=2.0)
            if bad:
                failures.append(f"{case}: differs from gloo: {bad}")
            digests[case] = _digest(x)
    return failures, digests


def _rank_streams(ctx):
    """Async ops from a non-default stream: inputs made on it, results read right after wait()."""
    import torch
    import torch.distributed as dist

    dev = _device(ctx)
    failures = []
    n = ctx.world_size
    side = torch.cuda.Stream(device=dev)
    for round_ in range(3):
        count = 3_000_017
        with torch.cuda.stream(side):
            # Produced on the side stream by a kernel that takes a while: the op must wait for it.
            x = torch.full((count,), float(ctx.rank + 1), device=dev)
            for _ in range(20):
                x = x * 1.0 + 0.0
            work = dist.all_reduce(x, group=ctx.group, async_op=True)
            work.wait()
            got = x.clone()  # queued on the side stream right after wait()
            x.fill_(-1.0)    # the caller reuses the buffer at once
            # all_gather_into_tensor, then the input is overwritten right after wait()
            inp = torch.arange(1000, device=dev, dtype=torch.float32) + 1000 * ctx.rank
            out = torch.empty(1000 * n, device=dev)
            dist.all_gather_into_tensor(out, inp, group=ctx.group, async_op=True).wait()
            gathered = out.clone()
            inp.fill_(-7.0)
            fut = dist.all_reduce(torch.ones(5, device=dev), group=ctx.group, async_op=True).get_future()
            fut_val = fut.wait()[0].clone()
        side.synchronize()
        want = float(n * (n + 1) // 2)
        if not torch.all(got == want):
            failures.append(f"round {round_}: all_reduce on a side stream gave {got.unique()[:5].tolist()}, expected {want}")
        if not torch.equal(gathered.cpu(), torch.cat([torch.arange(1000.0) + 1000 * r for r in range(n)])):
            failures.append(f"round {round_}: all_gather_into_tensor on a side stream is wrong")
        if not torch.all(fut_val == n):
            failures.append(f"round {round_}: the future's value is {fut_val.tolist()}")
        if out.device != dev or fut_val.device != dev:
            failures.append("results left the device")
    return failures, {}


def _rank_collectives(ctx):
    import torch
    import torch.distributed as dist

    dev = _device(ctx)
    n, r = ctx.world_size, ctx.rank
    failures = []

    def check(name, got, want):
        if not torch.equal(got.cpu(), want.cpu()):
            failures.append(f"{name}: got {got.cpu().reshape(-1)[:6].tolist()}..., expected {want.cpu().reshape(-1)[:6].tolist()}...")

    def mine(rank, m=1001, dtype=torch.float32):
        return (torch.arange(m, dtype=torch.float64) * (rank + 3) % 97).to(dtype)

    for root in range(n):
        t = mine(r).to(dev)
        dist.broadcast(t, src=root, group=ctx.group)
        check(f"broadcast root={root}", t, mine(root))
        t = mine(r).to(dev)
        dist.reduce(t, dst=root, group=ctx.group)
        if r == root:
            check(f"reduce root={root}", t, sum(mine(q) for q in range(n)))
        g = [torch.empty(1001, device=dev) for _ in range(n)] if r == root else None
        dist.gather(mine(r).to(dev), g, dst=root, group=ctx.group)
        if r == root:
            for q in range(n):
                check(f"gather root={root} from {q}", g[q], mine(q))
        out = torch.empty(1001, device=dev)
        dist.scatter(out, [mine(q).to(dev) for q in range(n)] if r == root else None, src=root, group=ctx.group)
        check(f"scatter root={root}", out, mine(r))
    out = torch.empty(1001 * n, device=dev, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, mine(r, dtype=torch.bfloat16).to(dev), group=ctx.group)
    check("all_gather_into_tensor bf16", out, torch.cat([mine(q, dtype=torch.bfloat16) for q in range(n)]))
    lst = [torch.empty(1001, device=dev, dtype=torch.int16) for _ in range(n)]
    dist.all_gather(lst, mine(r, dtype=torch.int16).to(dev), group=ctx.group)
    for q in range(n):
        check(f"all_gather list from {q}", lst[q], mine(q, dtype=torch.int16))
    full = [mine(q, 1001 * n) for q in range(n)]
    out = torch.empty(1001, device=dev)
    dist.reduce_scatter_tensor(out, full[r].to(dev), group=ctx.group)
    check("reduce_scatter_tensor", out, sum(full)[r * 1001:(r + 1) * 1001])
    src = (torch.arange(4 * n, dtype=torch.int64) + 100 * r).to(dev)
    dst = torch.empty(4 * n, dtype=torch.int64, device=dev)
    dist.all_to_all_single(dst, src, group=ctx.group)
    check("all_to_all_single", dst, torch.cat([torch.arange(4 * r, 4 * r + 4) + 100 * q for q in range(n)]))
    dist.barrier(group=ctx.group)
    # Point-to-point around the ring.
    nxt, prv = (r + 1) % n, (r - 1) % n
    got = torch.empty(333, device=dev)
    reqs = [dist.isend(mine(r, 333).to(dev), nxt, group=ctx.group), dist.irecv(got, prv, group=ctx.group)]
    for q in reqs:
        q.wait()
    check("send/recv", got, mine(prv, 333))
    objs = [{"rank": r}] if r == 0 else [None]
    dist.broadcast_object_list(objs, src=0, group=ctx.group)
    if objs != [{"rank": 0}]:
        failures.append(f"broadcast_object_list gave {objs}")
    backend = ctx.group._get_backend(dev)
    if backend.cuda_transport() != "cuda_ipc":
        failures.append(f"CUDA tensors travel by '{backend.cuda_transport()}', expected cuda_ipc on one host")
    # A tensor on the CPU in the same group still runs on the host ring.
    c = mine(r)
    dist.all_reduce(c, group=ctx.group)
    check("CPU tensor on the same group", c, sum(mine(q) for q in range(n)))
    return failures, {}


def _rank_kernels(ctx):
    """ringreduce's CUDA kernels alone, against torch's (fp16/bf16 computed in fp32)."""
    import torch
    from ringreduce import _C

    dev = _device(ctx)
    failures = []
    ops = {"sum": torch.add, "product": torch.mul, "min": torch.minimum, "max": torch.maximum,
           "band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}
    for dtype_name in DTYPE_NAMES:
        dt = reference.dtype_of(dtype_name)
        for name, f in ops.items():
            if name.startswith("b") and dtype_name not in reference.INT_NAMES + ["bool"]:
                continue
            if name in ("min", "max") and dtype_name in reference.COMPLEX_NAMES:
                continue
            for count, off in ((1, 0), (4099, 1), (1 << 20, 3)):
                a = reference.make_input(ctx.gen("ka", dtype_name, name, count, rank=0), dtype_name, count + off, "MAX", 2)
                b = reference.make_input(ctx.gen("kb", dtype_name, name, count, rank=0), dtype_name, count + off, "MAX", 2)
                a, b = a.to(dev)[off:], b.to(dev)[off:]
                d = torch.empty(count + 1, device=dev, dtype=dt)[1:]
                _C.reduce_tensors(d, a, b, name)
                if dtype_name == "bool":
                    want = {"sum": torch.logical_or, "product": torch.logical_and, "min": torch.logical_and,
                            "max": torch.logical_or, "band": torch.logical_and, "bor": torch.logical_or,
                            "bxor": torch.logical_xor}[name](a, b)
                elif dtype_name in ("float16", "bfloat16"):
                    want = f(a.float(), b.float()).to(dt)
                else:
                    want = f(a, b)
                same = torch.equal(d, want) or (dtype_name in reference.FLOAT_NAMES and
                                                torch.equal(torch.nan_to_num(d), torch.nan_to_num(want)))
                if not same and dtype_name in reference.COMPLEX_NAMES and name == "product":
                    # torch multiplies complex numbers with FMAs; ringreduce rounds each product
                    # (bit-identical to its CPU kernel, which the C++ test checks): close, not equal.
                    same = torch.allclose(d, want, rtol=1e-5 if dtype_name == "complex64" else 1e-12)
                if not same:
                    failures.append(f"kernel {name} {dtype_name} count={count} offset={off}: differs from torch")
    return failures, {}


def _rank_ddp(ctx, which):
    import torch
    import torch.nn as nn

    import ringreduce

    dev = _device(ctx)
    results = {}
    for setup in ("gloo", which):
        torch.manual_seed(1234)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                              nn.Linear(256, 8)).to(dev)
        group = ctx.gloo if setup == "gloo" else ctx.group
        if setup == "ringreduce_ddp":
            ddp = ringreduce.DistributedDataParallel(model, device_ids=[dev.index], process_group=group,
                                                     bucket_cap_mb=0.1)
        else:
            ddp = nn.parallel.DistributedDataParallel(model, device_ids=[dev.index], process_group=group,
                                                      bucket_cap_mb=0.1)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for step in range(4):
            g = ctx.gen("ddp", step, rank=ctx.rank)
            xb = torch.randn(16, 64, generator=g).to(dev)
            yb = torch.randn(16, 8, generator=g).to(dev)
            opt.zero_grad()
            nn.functional.mse_loss(ddp(xb), yb).backward()
            opt.step()
        results[setup] = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    failures = []
    diff = (results["gloo"] - results[which]).abs().max().item()
    if diff > 1e-5:
        failures.append(f"{which} on CUDA ends {diff:.3g} away from torch DDP on gloo")
    return failures, {f"{which} params": _digest(results[which])}


@pytest.mark.parametrize("world", [2, 4])
def test_cuda_all_reduce_every_dtype_and_op(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's CUDA path")
    pool = ranks(world)
    for dtypes in (DTYPE_NAMES[:4], DTYPE_NAMES[4:]):
        harness.check_results(pool.run(_rank_allreduce_sweep, dtypes, COUNTS, timeout=600))


def test_cuda_all_reduce_256_mib(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's CUDA path")
    harness.check_results(ranks(2).run(_rank_allreduce_sweep, ["float32"], [BIG], timeout=600))


@pytest.mark.parametrize("world", [2, 4])
def test_cuda_beside_gloo(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's CUDA path")
    harness.check_results(ranks(world).run(_rank_beside_gloo, timeout=300))


@pytest.mark.parametrize("world", [2, 4])
def test_cuda_async_ops_on_a_side_stream(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's CUDA path")
    harness.check_results(ranks(world).run(_rank_streams, timeout=300))


@pytest.mark.parametrize("world", [2, 4])
def test_cuda_other_collectives(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's CUDA path")
    harness.check_results(ranks(world).run(_rank_collectives, timeout=300))


def test_cuda_kernels_against_torch(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's CUDA path")
    harness.check_results(ranks(1).run(_rank_kernels, timeout=300))


@pytest.mark.parametrize("which", ["torch_ddp", "ringreduce_ddp"])
def test_cuda_ddp(ranks, backend, which):
    if backend != "ringreduce":
        pytest.skip("ringreduce's CUDA path")
    harness.check_results(ranks(2).run(_rank_ddp, which, timeout=300))

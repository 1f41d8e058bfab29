"""torch.distributed semantics of the backend under test, at world size 4.

Many async ops in flight; the Work API (wait with a timeout, is_completed, exception,
futures); two groups used alternately; concurrent subgroups and non-member calls;
broadcast from every root; barrier; object collectives; and bad input: mismatched
counts/dtypes across ranks must raise on every rank (not hang), unsupported dtype/op
combinations must raise at the call, before any communication. What torch's own suite asks
beyond these (sparse all_reduce, coalesced all_gather, monitored barrier, dtype lists) is in
test_torch_extras.py.
"""

from datetime import timedelta

import pytest

import harness
import reference
from reference import DTYPE_NAMES

WORLD = 4
OK_EXCEPTIONS = (RuntimeError, ValueError, TypeError)  # DistBackendError is a RuntimeError


def _int_valued(gen, dtype, count, lo=-1000, hi=1000):
    """Integer-valued data in ``dtype``: sums of a few are exact in any order."""
    import torch

    return torch.randint(lo, hi, (count,), generator=gen).to(dtype)


def _names(dtype):
    return str(dtype).replace("torch.", "")


def _check_sum(failures, name, out, inputs):
    import torch

    ref = torch.stack([x.to(torch.float64) for x in inputs]).sum(0).to(out.dtype)
    if not torch.equal(out, ref):
        bad = (out != ref).nonzero()
        i = int(bad[0]) if len(bad) else -1
        failures.append(f"{name}: {len(bad)}/{out.numel()} wrong; first at {i}: "
                        f"got {out[i].item()}, expected {ref[i].item()}")


# --------------------------------------------------------------------------------------
# many ops in flight


def _rank_many_in_flight(ctx, n):
    import torch
    import torch.distributed as dist

    plan_gen = ctx.gen("plan")  # the same plan on every rank
    dtypes = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bfloat16]
    plan = []
    for _ in range(n):
        dtype = dtypes[int(torch.randint(0, len(dtypes), (1,), generator=plan_gen))]
        # Mostly small, some empty, some large enough to be sliced and pipelined.
        kind = int(torch.randint(0, 10, (1,), generator=plan_gen))
        count = 0 if kind == 0 else int(torch.randint(1, 300_000 if kind == 9 else 5000, (1,), generator=plan_gen))
        plan.append((dtype, count))

    def inputs(round_, i, r):
        dtype, count = plan[i]
        lo, hi = (-30, 30) if dtype == torch.bfloat16 else (-1000, 1000)  # exact in bf16
        return _int_valued(ctx.gen(round_, i, rank=r), dtype, count, lo, hi)

    failures, digests = [], {}
    # Round 1: n async all_reduces issued back to back, all waited for at the end.
    tensors = [inputs("wait", i, ctx.rank).clone() for i in range(n)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    for w in works:
        w.wait()
    # Round 2: the same through futures, joined with torch.futures.collect_all.
    tensors2 = [inputs("future", i, ctx.rank).clone() for i in range(n)]
    futs = [dist.all_reduce(t, async_op=True).get_future() for t in tensors2]
    done = torch.futures.collect_all(futs).wait()
    for i, f in enumerate(done):
        v = f.value()
        if not (isinstance(v, list) and len(v) == 1 and v[0].data_ptr() == tensors2[i].data_ptr()):
            failures.append(f"future #{i}: value {v!r} is not [the output tensor]")
    for round_, ts in (("wait", tensors), ("future", tensors2)):
        for i, t in enumerate(ts):
            name = f"{round_} op #{i} ({_names(plan[i][0])}, count {plan[i][1]})"
            digests[name] = harness.digest(t)
            if i % ctx.world_size == ctx.rank:
                _check_sum(failures, name, t, [inputs(round_, i, r) for r in range(ctx.world_size)])
    return failures, digests


def test_many_async_in_flight(ranks):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_many_in_flight, 50, timeout=120))


# --------------------------------------------------------------------------------------
# Work API


def _rank_work_api(ctx):
    import torch
    import torch.distributed as dist

    failures = []
    x = [_int_valued(ctx.gen("x", rank=r), torch.float32, 4099) for r in range(ctx.world_size)]
    t = x[ctx.rank].clone()
    w = dist.all_reduce(t, async_op=True)
    c = w.is_completed()
    if not isinstance(c, bool):
        failures.append(f"is_completed() before wait returned {c!r}, not a bool")
    r = w.wait(timeout=timedelta(seconds=30))
    if r is not True:
        failures.append(f"wait(timeout=30s) returned {r!r}, expected True")
    if not w.is_completed():
        failures.append("is_completed() is False after wait()")
    e = w.exception()
    if e is not None:
        failures.append(f"exception() is {e!r} after a successful op, expected None")
    _check_sum(failures, "wait(timeout)", t, x)
    # wait() again on a completed Work returns at once.
    if w.wait() is not True:
        failures.append("a second wait() did not return True")
    return failures, {"work api": harness.digest(t)}


def test_work_api(ranks):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_work_api, timeout=60))


def _rank_future_done_after_wait(ctx, n):
    """After work.wait() returns, the Work's future holds the value: user code may call
    ``work.wait(); work.get_future().value()`` (gloo completes the future before the Work)."""
    import torch
    import torch.distributed as dist

    late = 0
    for i in range(n):
        t = torch.full((1 + i % 7,), float(ctx.rank))
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        if not w.get_future().done():
            late += 1
    fails = [f"{late}/{n} times get_future().done() was False right after work.wait() returned"] if late else []
    return fails, {}


def test_future_done_after_wait(ranks):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_future_done_after_wait, 300, timeout=60))


def _rank_wait_timeout_expires(ctx, backend):
    """Rank 0 waits with a 1 s timeout on an op the others have not issued yet."""
    import time

    import torch
    import torch.distributed as dist

    failures = []
    g = dist.new_group(backend=backend, timeout=timedelta(seconds=10))
    t = torch.ones(1000)
    w = None
    if ctx.rank == 0:
        w = dist.all_reduce(t, group=g, async_op=True)
        t0 = time.monotonic()
        try:
            r = w.wait(timeout=timedelta(seconds=1))
            if r is not False:
                failures.append(f"wait(timeout=1s) on an op no peer had issued returned {r!r}; "
                                "expected an exception (or False)")
        except OK_EXCEPTIONS:
            pass
        elapsed = time.monotonic() - t0
        if elapsed > 6:
            failures.append(f"wait(timeout=1s) returned after {elapsed:.1f}s")
    dist.barrier(group=ctx.gloo)
    if ctx.rank != 0:
        w = dist.all_reduce(t, group=g, async_op=True)
    # Whether the op still completes after rank 0's wait timed out is up to the backend;
    # it must not hang: every rank's wait ends within the group's 10 s timeout.
    t0 = time.monotonic()
    try:
        w.wait()
    except OK_EXCEPTIONS:
        pass
    elapsed = time.monotonic() - t0
    if elapsed > 25:
        failures.append(f"rank {ctx.rank}: the final wait took {elapsed:.1f}s (group timeout 10s)")
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    return failures, {}


def test_wait_timeout_expires(ranks, backend):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_wait_timeout_expires, backend, timeout=90))


# --------------------------------------------------------------------------------------
# several groups


def _rank_two_groups(ctx, backend, n):
    import torch
    import torch.distributed as dist

    groups = {"g1": dist.new_group(backend=backend), "g2": dist.new_group(backend=backend),
              "world": ctx.group}
    # Per group the order of ops is the same on every rank (it has to be); across groups
    # every rank interleaves them differently, which independent groups must allow.
    ops = [(gname, i) for gname in groups for i in range(n)]
    perm = torch.randperm(len(ops), generator=ctx.rng).tolist()
    order, seen = [], {g: 0 for g in groups}
    for k in perm:
        gname = ops[k][0]
        order.append((gname, seen[gname]))
        seen[gname] += 1

    def inputs(gname, i, r):
        count = 1 + (i * 7919) % 20_000
        return _int_valued(ctx.gen(gname, i, rank=r), torch.float32, count)

    results, works = {}, []
    for gname, i in order:
        t = inputs(gname, i, ctx.rank).clone()
        works.append(dist.all_reduce(t, group=groups[gname], async_op=True))
        results[(gname, i)] = t
    for w in works:
        w.wait()
    failures, digests = [], {}
    for (gname, i), t in sorted(results.items()):
        name = f"{gname} op #{i}"
        digests[name] = harness.digest(t)
        _check_sum(failures, name, t, [inputs(gname, i, r) for r in range(ctx.world_size)])
    dist.destroy_process_group(groups["g1"])
    dist.destroy_process_group(groups["g2"])
    return failures, digests


def test_two_groups_interleaved(ranks, backend):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_two_groups, backend, 12, timeout=120))


def _rank_subgroups(ctx, backend):
    import warnings

    import torch
    import torch.distributed as dist

    odd = dist.new_group(ranks=[1, 3], backend=backend)
    even = dist.new_group(ranks=[0, 2], backend=backend)
    members = [1, 3] if ctx.rank % 2 else [0, 2]
    mine, other = (odd, even) if ctx.rank % 2 else (even, odd)
    failures = []
    if dist.get_world_size(mine) != 2 or dist.get_rank(mine) != members.index(ctx.rank):
        failures.append(f"rank {ctx.rank}: size/rank in its subgroup "
                        f"{dist.get_world_size(mine)}/{dist.get_rank(mine)}")
    if dist.get_rank(other) != -1:
        failures.append(f"rank {ctx.rank}: get_rank(non-member group) = {dist.get_rank(other)}, expected -1")

    # Both subgroups run at once: several async ops, then a sync one.
    def inputs(i, r):
        return _int_valued(ctx.gen("sub", i, rank=r), torch.float32, 1000 + 611 * i)

    ts = [inputs(i, ctx.rank).clone() for i in range(5)]
    works = [dist.all_reduce(t, group=mine, async_op=True) for t in ts[:4]]
    dist.all_reduce(ts[4], group=mine)
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        _check_sum(failures, f"subgroup {members} op #{i}", t, [inputs(i, r) for r in members])

    # Calls on a group this rank is not in: torch warns and returns None, touching nothing.
    x = torch.arange(10, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kw in ({}, {"async_op": True}):
            r = dist.all_reduce(x, group=other, **kw)
            if r is not None:
                failures.append(f"all_reduce on a non-member group ({kw}) returned {r!r}, expected None")
        r = dist.broadcast(x, src=members[0] ^ 1, group=other)
        if r is not None:
            failures.append(f"broadcast on a non-member group returned {r!r}")
    if not torch.equal(x, torch.arange(10, dtype=torch.float32)):
        failures.append("a non-member call changed the tensor")
    # The default group still works after (and between) the subgroup ops.
    y = [_int_valued(ctx.gen("after", rank=r), torch.float32, 333) for r in range(ctx.world_size)]
    t = y[ctx.rank].clone()
    dist.all_reduce(t)
    _check_sum(failures, "default group after subgroups", t, y)
    dist.destroy_process_group(odd)
    dist.destroy_process_group(even)
    return failures, {}


def test_concurrent_subgroups(ranks, backend):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_subgroups, backend, timeout=90))


# --------------------------------------------------------------------------------------
# broadcast and barrier

BCAST_LAYOUTS = {
    None: None,
    "transposed-2d": ((37, 29), lambda b: b.t()),
    "strided-slice": ((3001,), lambda b: b[1::3]),
}


def _rank_broadcast(ctx, dtype_name, counts):
    import torch
    import torch.distributed as dist

    standin = harness.standin()
    failures, digests = [], {}
    cases = [(root, count, None, mode) for root in range(ctx.world_size) for count in counts
             for mode in ("sync", "async")]
    cases += [(root, None, layout, "async") for root in range(ctx.world_size)
              for layout in BCAST_LAYOUTS if layout and not (standin and layout == "strided-slice")]

    def build(name, r, count, layout):
        gen = ctx.gen(name, rank=r)
        if layout is None:
            b = reference.make_input(gen, dtype_name, count, "MAX", ctx.world_size)
            return b, b
        shape, view = BCAST_LAYOUTS[layout]
        b = reference.make_input(gen, dtype_name, None, "MAX", ctx.world_size, shape=shape)
        return b, view(b)

    for root, count, layout, mode in cases:
        name = (f"broadcast world={ctx.world_size} root={root} dtype={dtype_name} "
                + (f"layout={layout}" if layout else f"count={count}") + f" mode={mode}")
        base, t = build(name, ctx.rank, count, layout)
        base_before = base.clone()
        expect = build(name, root, count, layout)[1].clone()
        try:
            if mode == "sync":
                r = dist.broadcast(t, src=root)
                if r is not None:
                    failures.append(f"{name}: sync broadcast returned {r!r}")
            else:
                w = dist.broadcast(t, src=root, async_op=True)
                w.wait()
        except Exception as e:
            failures.append(f"{name}: rank {ctx.rank} raised {type(e).__name__}: {str(e)[:300]}")
            continue
        got = harness.digest(t)
        digests[name] = got
        if got != harness.digest(expect):
            failures.append(f"{name}: rank {ctx.rank}: result differs from the root's tensor")
        if layout:
            mask = torch.ones(base.shape, dtype=torch.bool)
            BCAST_LAYOUTS[layout][1](mask).fill_(False)
            if harness.digest(base[mask]) != harness.digest(base_before[mask]):
                failures.append(f"{name}: rank {ctx.rank}: elements of the base outside the view were modified")
        if reference.gloo_broadcast_supports(dtype_name):
            g = build(name, ctx.rank, count, layout)[1].clone(memory_format=torch.contiguous_format)
            dist.broadcast(g, src=root, group=ctx.gloo)
            if harness.digest(g) != got:
                failures.append(f"{name}: rank {ctx.rank}: differs from gloo's broadcast")
    return failures, digests


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_broadcast(ranks, standin, dtype_name):
    if standin and dtype_name == "int16":
        pytest.skip("gloo stand-in: gloo has no int16")
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_broadcast, dtype_name, [0, 1, 2**20 + 3], timeout=120))


def _rank_barrier(ctx):
    import torch.distributed as dist

    failures = []
    for i, kw in enumerate(({}, {"async_op": True}, {})):
        # Every rank writes its key before the barrier, so after it all keys exist.
        keys = [f"barrier/{ctx.seed}/{i}/{r}" for r in range(ctx.world_size)]
        ctx.store.set(keys[ctx.rank], "1")
        w = dist.barrier(**kw)
        if kw:
            w.wait()
        if not ctx.store.check(keys):
            missing = [k for k in keys if not ctx.store.check([k])]
            failures.append(f"barrier #{i} {kw}: returned before {missing} were set")
    return failures, {}


def test_barrier(ranks):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_barrier, timeout=60))


# --------------------------------------------------------------------------------------
# object collectives


def _rank_broadcast_object_list(ctx):
    import torch.distributed as dist

    failures = []
    for root in range(ctx.world_size):
        objs = [{"root": root, "data": list(range(root * 10))}, f"s{root}", None]
        got = objs if ctx.rank == root else [None, None, None]
        dist.broadcast_object_list(got, src=root)
        if got != objs:
            failures.append(f"broadcast_object_list from root {root}: got {got!r}")
    return failures, {}


def test_broadcast_object_list(ranks):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_broadcast_object_list, timeout=60))


def _rank_all_gather_object(ctx):
    import torch.distributed as dist

    out = [None] * ctx.world_size
    dist.all_gather_object(out, {"rank": ctx.rank, "x": [ctx.rank] * ctx.rank})
    expect = [{"rank": r, "x": [r] * r} for r in range(ctx.world_size)]
    return ([] if out == expect else [f"all_gather_object: got {out!r}"]), {}


def test_all_gather_object(ranks):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_all_gather_object, timeout=30))


# --------------------------------------------------------------------------------------
# bad input

MISMATCHES = {
    # name: (mode, per-rank (dtype, count))
    "count-sync": ("sync", lambda r, w: ("float32", 1000 + 7 * (r == w - 1))),
    "count-async": ("async", lambda r, w: ("float32", 1000 + 7 * (r == 0))),
    "dtype-float64-vs-float32": ("sync", lambda r, w: ("float64" if r == 0 else "float32", 1000)),
    "dtype-int32-vs-float32-same-bytes": ("async", lambda r, w: ("int32" if r == w - 1 else "float32", 1000)),
}


def _rank_mismatch(ctx, backend, kind):
    import time

    import torch
    import torch.distributed as dist

    mode, spec = MISMATCHES[kind]
    dtype_name, count = spec(ctx.rank, ctx.world_size)
    failures = []
    g = dist.new_group(backend=backend, timeout=timedelta(seconds=20))
    t = reference.make_input(ctx.gen("in", rank=ctx.rank), dtype_name, count, "SUM", ctx.world_size)
    before = harness.digest(t)
    name = f"mismatch {kind} (rank {ctx.rank}: {count} x {dtype_name}, {mode})"
    t0 = time.monotonic()
    err = None
    try:
        if mode == "sync":
            dist.all_reduce(t, group=g)
        else:
            dist.all_reduce(t, group=g, async_op=True).wait()
    except Exception as e:
        err = e
    elapsed = time.monotonic() - t0
    if err is None:
        failures.append(f"{name}: did not raise")
    else:
        if not isinstance(err, RuntimeError):
            failures.append(f"{name}: raised {type(err).__name__}, expected RuntimeError/DistBackendError: {err}")
        if "allreduce" not in str(err).lower().replace("_", ""):
            failures.append(f"{name}: the message does not name the op (allreduce): {str(err)[:300]!r}")
        # Detected from the ops' fingerprints, not by running into the group's timeout.
        if "called different collectives" not in str(err):
            failures.append(f"{name}: the message does not say the ranks disagree: {str(err)[:300]!r}")
    if elapsed > 5:
        failures.append(f"{name}: took {elapsed:.1f}s to fail (group timeout 20s): not detected")
    if harness.digest(t) != before:
        failures.append(f"{name}: the caller's tensor changed")
    # The default group is independent of the broken one and still works.
    y = [_int_valued(ctx.gen("after", rank=r), torch.float32, 777) for r in range(ctx.world_size)]
    tt = y[ctx.rank].clone()
    dist.all_reduce(tt)
    _check_sum(failures, f"default group after {kind}", tt, y)
    dist.destroy_process_group(g)
    return failures, {}


@pytest.mark.parametrize("kind", list(MISMATCHES))
def test_mismatch_raises_everywhere(ranks, standin, backend, kind):
    if standin:
        pytest.skip("gloo stand-in: gloo aborts the process on a size mismatch")
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_mismatch, backend, kind, timeout=90))


def _bad_calls():
    """name -> (callable issuing the op, tensors it must leave alone, words of which the
    message must name at least one, whether gloo rejects it at the call too).

    gloo accepts tensor lists, and refuses complex MIN/MAX/BAND and
    bool AVG only after it has communicated."""
    import torch
    import torch.distributed as dist

    def internal(tensors, op):
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        return lambda: dist.group.WORLD.allreduce(tensors, opts)

    def public(t, op):
        return lambda: dist.all_reduce(t, op=op)

    R = dist.ReduceOp
    c64 = torch.randn(10, dtype=torch.complex64)
    c128 = torch.randn(10, dtype=torch.complex128)
    f32 = torch.randn(10)
    bf16 = torch.randn(10, dtype=torch.bfloat16)
    b = torch.ones(10, dtype=torch.bool)
    i64 = torch.arange(10)
    sp = torch.sparse_coo_tensor([[0, 3]], [1.0, 2.0], (10,))
    two = [torch.randn(10), torch.randn(10)]
    return {
        "MIN-on-complex64": (internal([c64], R.MIN), [c64], ["min", "complex"], False),
        "MAX-on-complex128": (internal([c128], R.MAX), [c128], ["max", "complex"], False),
        "BAND-on-complex64": (internal([c64], R.BAND), [c64], ["band", "complex"], False),
        "BAND-on-float32": (public(f32, R.BAND), [f32], ["band", "float"], True),
        "BXOR-on-bfloat16": (public(bf16, R.BXOR), [bf16], ["bxor", "bfloat16", "float"], True),
        "AVG-on-bool": (public(b, R.AVG), [b], ["avg", "bool"], False),
        "PREMUL_SUM-on-int64": (public(i64, dist._make_nccl_premul_sum(2.0)), [i64],
                                ["premul", "int64", "long", "integer"], True),
        "sparse-MAX": (public(sp, R.MAX), [], ["sparse"], False),  # sparse: SUM only, as gloo
        "two-tensors": (internal(two, R.SUM), two, ["tensor"], False),
    }


def _rank_bad_calls(ctx):
    import torch
    import torch.distributed as dist

    standin = harness.standin()
    failures = []
    # Rank r repeats every bad call r+1 times: if any of them communicated, the ranks
    # would fall out of step and the good all_reduce below would fail or hang.  (gloo
    # does communicate before it raises for some of them: once per rank then.)
    for rep in range(1 if standin else ctx.rank + 1):
        for name, (call, keep, words, gloo_rejects) in _bad_calls().items():
            if standin and not gloo_rejects:
                continue
            before = [harness.digest(k) for k in keep]
            try:
                w = call()
            except OK_EXCEPTIONS as e:
                msg = str(e).lower()
                if not standin:
                    if "allreduce" not in msg.replace("_", ""):
                        failures.append(f"{name}: message does not name the op (allreduce): {str(e)[:300]!r}")
                    if not any(wd in msg for wd in words):
                        failures.append(f"{name}: message names none of {words}: {str(e)[:300]!r}")
            except Exception as e:
                failures.append(f"{name}: raised {type(e).__name__} (expected RuntimeError/ValueError): {e}")
            else:
                failures.append(f"{name}: rank {ctx.rank} call #{rep} did not raise at the call")
                try:  # don't leave it hanging
                    if w is not None:
                        w.wait(timeout=timedelta(seconds=5))
                except Exception:
                    pass
            if [harness.digest(k) for k in keep] != before:
                failures.append(f"{name}: the caller's tensor changed")
    # The group is still usable, and in step on every rank.
    for i in range(3):
        y = [_int_valued(ctx.gen("after", i, rank=r), torch.float32, 1000 + i) for r in range(ctx.world_size)]
        t = y[ctx.rank].clone()
        dist.all_reduce(t)
        _check_sum(failures, f"all_reduce #{i} after the bad calls", t, y)
    return sorted(set(failures)), {}


def test_unsupported_raises_at_call(ranks):
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_bad_calls, timeout=60))


def _rank_storage_changed_under_async_ops(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    big = 4 << 20  # long enough that the caller's next line runs while the op does
    report = {}
    # set_: the caller's tensor takes another storage; the op keeps (and writes) the one it had.
    for _ in range(5):
        t = torch.full((big,), float(r + 1))
        w = dist.all_reduce(t, async_op=True)
        t.set_(torch.zeros(3))
        w.wait()
    report["set_"] = t.tolist()
    # resize_ that grows the storage is refused while the op runs, and works once it is done.
    # Each rank in turn issues its op first and tries the resize_ while its peer holds back at a
    # gloo barrier: the op cannot finish before the peer joins, however the scheduler runs them.
    for first in range(n):
        t = torch.full((big,), float(r + 1))
        if r == first:
            w = dist.all_reduce(t, async_op=True)
            try:
                t.resize_(4 * big)
                report["resize_"] = "allowed while the op ran"
            except RuntimeError as e:
                report["resize_"] = str(e)
            dist.barrier(group=ctx.gloo)
            w.wait()
            t.resize_(4 * big)  # allowed again
            report["result"] = float(t[:big].min()), float(t[:big].max())
        else:
            dist.barrier(group=ctx.gloo)
            dist.all_reduce(t)
    # Other collectives, and point-to-point, the same way.
    x = torch.full((big,), float(r))
    out = torch.empty(big * n)
    w = dist.all_gather_into_tensor(out, x, async_op=True)
    x.set_(torch.zeros(1))
    out.set_(torch.zeros(1))
    w.wait()
    peer = (r + 1) % n if r % 2 == 0 else (r - 1) % n
    buf = torch.full((big,), float(r))
    w = dist.isend(buf, peer) if r % 2 == 0 else dist.irecv(buf, peer)
    buf.set_(torch.zeros(2))
    w.wait()
    # Once its op has completed, a Work the caller keeps holds none of the op's tensors: the
    # input's storage has as many references with the Work as after it is gone.
    x = torch.full((1 << 16,), float(r))
    out = torch.empty((1 << 16) * n)
    w = dist.all_gather_into_tensor(out, x, async_op=True)
    w.wait()
    uses = torch._C._storage_Use_Count(x.untyped_storage()._cdata)
    del w
    report["input refs kept by a completed Work"] = uses - torch._C._storage_Use_Count(
        x.untyped_storage()._cdata)
    t = torch.ones(7)
    dist.all_reduce(t)  # the group still works
    report["after"] = t.tolist()
    return report


def test_storage_replaced_or_resized_under_an_async_op(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("gloo crashes the process on this (it frees the memory under the op)")
    n = 2
    total = float(sum(range(1, n + 1)))
    for rank, rep in enumerate(ranks(n).run(_rank_storage_changed_under_async_ops, timeout=120)):
        assert rep["set_"] == [0.0, 0.0, 0.0], rep
        assert "not resizable" in rep["resize_"], (rank, rep["resize_"])
        assert rep["result"] == (total, total), (rank, rep)
        assert rep["input refs kept by a completed Work"] == 0, (rank, rep)
        assert rep["after"] == [float(n)] * 7, (rank, rep)

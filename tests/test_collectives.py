"""The ring's halves as collectives: reduce_scatter (list form and reduce_scatter_tensor) and
all_gather (list form and all_gather_into_tensor), swept over world size, count, dtype and op,
against a float64 reference and gloo on the same inputs; all_gather bit-identical across ranks,
reduce_scatter bit-identical to the matching chunk of an all_reduce."""

import pytest

import harness
import reference
from reference import DTYPE_NAMES, ops_for

COUNTS = [0, 1, 1009, (1 << 16) + 3]


def _rank_reduce_scatter(ctx, dtype_name, counts):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures, digests = [], {}
    standin = ctx.backend != "ringreduce"
    for op in ops_for(dtype_name):
        if dtype_name in reference.COMPLEX_NAMES and op == "PRODUCT":
            continue  # torch's reduce_scatter refuses PRODUCT on complex tensors before any backend
        if standin and reference.standin_skip(dtype_name, op):
            continue
        factor = -0.75 if op == "PREMUL_SUM" else None
        for count in counts:
            # Each rank's input is n chunks of `count`; rank r gets chunk r of the reduction.
            inputs = [reference.make_input(ctx.gen("rs", dtype_name, op, count, rank=q), dtype_name,
                                         count * n, op, n) for q in range(n)]
            ref = reference.reference(inputs, dtype_name, op, factor)[r * count:(r + 1) * count]
            exact = reference.exact_kind(dtype_name, op)
            scale = None if exact else reference.float_scale(inputs, dtype_name, op, factor)
            if scale is not None:
                scale = scale[r * count:(r + 1) * count]
            for form in ("tensor", "list"):
                case = f"reduce_scatter {form} world={n} {dtype_name} {op} count={count}"
                x = inputs[r].clone()
                out = torch.empty(count, dtype=x.dtype)
                try:
                    if form == "tensor":
                        w = dist.reduce_scatter_tensor(out, x, op=reference.reduce_op(op, factor),
                                                       async_op=True)
                    else:
                        w = dist.reduce_scatter(out, list(x.split(count)) if count else
                                                [x.clone() for _ in range(n)],
                                                op=reference.reduce_op(op, factor), async_op=True)
                    w.wait()
                except Exception as e:  # noqa: BLE001 - reported with the case
                    failures.append(f"{case}: raised {type(e).__name__}: {e}")
                    continue
                if not torch.equal(x, inputs[r]):
                    failures.append(f"{case}: the input was modified")
                msg = reference.compare(out, ref, dtype_name, op, scale)
                if msg:
                    failures.append(f"{case}: vs reference: {msg}")
                if not standin and form == "tensor":
                    # Each rank gets a different chunk, so the cross-rank check is this: the
                    # reduce-scatter follows the all-reduce's ring order, bit for bit.
                    full = inputs[r].clone()
                    dist.all_reduce(full, op=reference.reduce_op(op, factor))
                    mine = full[r * count:(r + 1) * count]
                    if harness.digest(out) != harness.digest(mine):
                        failures.append(f"{case}: differs bitwise from chunk {r} of all_reduce")
                if not standin and reference.gloo_supports(dtype_name, op) and form == "tensor":
                    g = torch.empty(count, dtype=x.dtype)
                    try:
                        dist.reduce_scatter_tensor(g, inputs[r].clone(), op=reference.reduce_op(op, factor),
                                                   group=ctx.gloo)
                    except RuntimeError:
                        continue  # gloo lacks this dtype/op for reduce_scatter
                    msg = reference.compare(out, g, dtype_name, op, scale, slack=2.0)
                    if msg:
                        failures.append(f"{case}: vs gloo: {msg}")
    return failures, digests


def _rank_all_gather(ctx, dtype_names, counts):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures, digests = [], {}
    for dtype_name in dtype_names:
        for count in counts:
            inputs = [reference.make_input(ctx.gen("ag", dtype_name, count, rank=q), dtype_name, count,
                                         "SUM", n) for q in range(n)]
            want = torch.cat(inputs)
            for form in ("tensor", "inplace", "list", "list-strided"):
                case = f"all_gather {form} world={n} {dtype_name} count={count}"
                x = inputs[r].clone()
                if form == "tensor":
                    out = torch.empty(count * n, dtype=x.dtype)
                    dist.all_gather_into_tensor(out, x, async_op=True).wait()
                elif form == "inplace":  # the input is the output's own chunk
                    out = torch.empty(count * n, dtype=x.dtype)
                    out[r * count:(r + 1) * count] = x
                    dist.all_gather_into_tensor(out, out[r * count:(r + 1) * count])
                elif form == "list":
                    outs = [torch.empty(count, dtype=x.dtype) for _ in range(n)]
                    dist.all_gather(outs, x, async_op=True).wait()
                    out = torch.cat(outs)
                else:  # each output a column of a 2-D tensor: strided, written back by ringreduce
                    base = torch.zeros(count, n, dtype=x.dtype)
                    outs = [base[:, c] for c in range(n)]
                    dist.all_gather(outs, x)
                    out = torch.cat(outs)
                if not torch.equal(x, inputs[r]) and form != "inplace":
                    failures.append(f"{case}: the input was modified")
                if not torch.equal(out, want):
                    bad = int((out != want).sum()) if out.shape == want.shape else "all"
                    failures.append(f"{case}: {bad} elements differ from the ranks' inputs")
                digests[case] = harness.digest(out)
    return failures, digests


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_reduce_scatter_sweep(ranks, world):
    pool = ranks(world)
    for dtype_name in DTYPE_NAMES:
        harness.check_results(pool.run(_rank_reduce_scatter, dtype_name, COUNTS, timeout=300))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_all_gather_sweep(ranks, world):
    pool = ranks(world)
    harness.check_results(pool.run(_rank_all_gather, DTYPE_NAMES, COUNTS, timeout=300))


@pytest.mark.parametrize("world", [2, 4])
def test_halves_with_tiny_slices(ranks, world):
    pool = ranks(world, env={"RINGREDUCE_SLICE_BYTES": "64", "RINGREDUCE_SLOTS": "2"})
    for dtype_name in ("float32", "int64", "bfloat16"):
        harness.check_results(pool.run(_rank_reduce_scatter, dtype_name, [0, 1, 1009], timeout=300))
    harness.check_results(pool.run(_rank_all_gather, ["float32", "uint8"], [0, 1, 1009], timeout=300))


def _rank_mismatch(ctx, kind):
    import datetime

    import torch
    import torch.distributed as dist

    g = dist.new_group(backend=ctx.backend, timeout=datetime.timedelta(seconds=20))
    n = ctx.world_size
    count = 100 if ctx.rank != n - 1 else 60  # the last rank disagrees
    try:
        if kind == "reduce_scatter":
            dist.reduce_scatter_tensor(torch.empty(count), torch.ones(count * n), group=g)
        else:
            dist.all_gather_into_tensor(torch.empty(count * n), torch.ones(count), group=g)
    except RuntimeError as e:
        return str(e)
    finally:
        dist.destroy_process_group(g)
    return None


@pytest.mark.parametrize("kind", ["reduce_scatter", "allgather"])
def test_mismatched_sizes_fail_on_every_rank(ranks, backend, kind):
    if backend != "ringreduce":
        pytest.skip("gloo aborts the process on a size mismatch")
    errors = ranks(4).run(_rank_mismatch, kind, timeout=60)
    for rank, err in enumerate(errors):
        assert err is not None, f"rank {rank} did not fail"
        assert f"ringreduce {kind}" in err and "100" in err and "60" in err, f"rank {rank}: {err}"


def _rank_bad_sizes(ctx):
    import torch
    import torch.distributed as dist

    n = ctx.world_size
    msgs = []
    for call in (
        lambda: dist.reduce_scatter_tensor(torch.empty(5), torch.ones(5 * n + 1)),
        lambda: dist.all_gather_into_tensor(torch.empty(5 * n - 1), torch.ones(5)),
        lambda: dist.all_gather([torch.empty(5)] * (n + 1), torch.ones(5)),
        lambda: dist.reduce_scatter(torch.empty(5), [torch.ones(5)] * (n + 1)),
        lambda: dist.all_gather([torch.empty(5, dtype=torch.int32)] * n, torch.ones(5)),
    ):
        try:
            call()
            msgs.append(None)
        except (RuntimeError, ValueError) as e:
            msgs.append(str(e))
    # The group is still usable after rejected calls.
    t = torch.ones(3)
    dist.all_reduce(t)
    return msgs, t.tolist()


def test_bad_sizes_fail_at_the_call(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("checks ringreduce's messages")
    for msgs, t in ranks(2).run(_rank_bad_sizes, timeout=60):
        assert t == [2.0, 2.0, 2.0]
        for m in msgs:
            # ringreduce's own messages, or torch's where its Python layer checks first (dtypes).
            assert m is not None and ("ringreduce" in m or "dtype" in m.lower()), msgs


def _rank_coalesced(ctx):
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_group

    n, r = ctx.world_size, ctx.rank
    failures = []
    backend = _get_default_group()._get_backend(torch.device("cpu"))
    sizes = [0, 1, 1009, 4099]
    xs = [[torch.randint(-99, 99, (k,), generator=ctx.gen("co", k, rank=q)).float() for k in sizes]
          for q in range(n)]

    ts = [x.clone() for x in xs[r]]
    backend.allreduce_coalesced(ts).wait()
    for k, t in zip(sizes, ts):
        if not torch.equal(t, sum(x[sizes.index(k)] for x in xs)):
            failures.append(f"allreduce_coalesced: size {k} wrong")

    # What torch's functional collectives (DTensor.full_tensor) call.
    outs = [torch.empty(k * n) for k in sizes]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, x in zip(outs, xs[r]):
            dist.all_gather_into_tensor(o, x)
    cm.wait()
    for k, o in zip(sizes, outs):
        if not torch.equal(o, torch.cat([x[sizes.index(k)] for x in xs])):
            failures.append(f"all_gather_into_tensor coalesced: size {k} wrong")

    outs = [torch.empty(k) for k in sizes]
    ins = [torch.cat([x[i] for _ in range(n)]) * (r + 1) for i, x in enumerate([xs[r]] * len(sizes))]
    with dist._coalescing_manager(async_ops=True) as cm:  # reduce_scatter_tensor_coalesced
        for o, x in zip(outs, ins):
            dist.reduce_scatter_tensor(o, x)
    cm.wait()
    for i, (k, o) in enumerate(zip(sizes, outs)):
        want = sum(xs[q][i] * (q + 1) for q in range(n))
        if not torch.equal(o, want):
            failures.append(f"reduce_scatter_tensor_coalesced: size {k} wrong")

    # torch's layout: one list per rank, each with one tensor per input; the same through gloo.
    for g, which in ((None, "ringreduce"), (ctx.gloo, "gloo")):
        lists = [[torch.full((k,), -1.0) for k in sizes] for _ in range(n)]
        dist.all_gather_coalesced(lists, [x.clone() for x in xs[r]], group=g)
        for i, k in enumerate(sizes):
            if not all(torch.equal(lists[q][i], xs[q][i]) for q in range(n)):
                failures.append(f"all_gather_coalesced ({which}): size {k} wrong")
    return failures, {}


def test_coalesced_forms(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("gloo has no reduce_scatter_tensor_coalesced")
    for world in (1, 2, 3):
        harness.check_results(ranks(world).run(_rank_coalesced, timeout=120))


def _rank_op_from_callback(ctx, size):
    import torch
    import torch.distributed as dist

    # Future callbacks run on the group's progress thread; one that issues an op of the same group
    # and waits for it (as PowerSGD's hook does) must not wait for its own thread.
    t = torch.ones(size)
    t2 = torch.full((size,), 2.0)
    fut = dist.all_reduce(t, async_op=True).get_future()
    got = fut.then(lambda f: dist.all_reduce(t2, async_op=True).get_future().wait()[0]).wait()
    n = ctx.world_size
    ok = torch.equal(t, torch.full((size,), float(n))) and torch.equal(got, torch.full((size,), 2.0 * n))
    # The same with a synchronous op inside the callback, and a Work waited for in it.
    t3 = torch.ones(size)
    fut = dist.all_reduce(torch.ones(size), async_op=True).get_future()
    fut.then(lambda f: dist.all_reduce(t3)).wait()
    t4 = torch.ones(size)
    fut = dist.all_reduce(torch.ones(size), async_op=True).get_future()
    fut.then(lambda f: dist.all_reduce(t4, async_op=True).wait()).wait()
    ok = ok and torch.equal(t3, torch.full((size,), float(n))) and torch.equal(t4, torch.full((size,), float(n)))
    return ([] if ok else [f"op from a future callback, size {size}: wrong result"]), {}


@pytest.mark.parametrize("size", [4, 1 << 20])
def test_op_issued_and_waited_for_in_a_future_callback(ranks, size):
    harness.check_results(ranks(2).run(_rank_op_from_callback, size, timeout=60))


def _gloo_or_none(fn):
    """gloo's result for the same call, or None where gloo refuses the dtype (int16, ...)."""
    try:
        return fn()
    except RuntimeError:
        return None


def _rank_rooted_and_alltoall(ctx, dtype_names, counts):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    standin = ctx.backend != "ringreduce"
    failures, digests = [], {}
    for dtype_name in dtype_names:
        if standin and not reference.gloo_broadcast_supports(dtype_name):
            continue  # gloo moves no int16 at all
        for count in counts:
            for op in ops_for(dtype_name):
                if dtype_name in reference.COMPLEX_NAMES and op == "PRODUCT":
                    continue  # dist.reduce refuses complex PRODUCT before any backend
                if standin and reference.standin_skip(dtype_name, op):
                    continue
                factor = -0.75 if op == "PREMUL_SUM" else None
                xs = [reference.make_input(ctx.gen("x", dtype_name, op, count, rank=q), dtype_name, count,
                                         op, n) for q in range(n)]
                want = reference.reference(xs, dtype_name, op, factor)
                exact = reference.exact_kind(dtype_name, op)
                scale = None if exact else reference.float_scale(xs, dtype_name, op, factor)
                for root in range(n):
                    case = f"reduce world={n} {dtype_name} {op} count={count} root={root}"
                    t = xs[r].clone()
                    dist.reduce(t, dst=root, op=reference.reduce_op(op, factor))
                    g = None
                    # gloo's bool SUM leaves 2s in a bool tensor; its results are not comparable.
                    if reference.gloo_supports(dtype_name, op) and not (dtype_name == "bool" and op == "SUM"):
                        g = xs[r].clone()
                        dist.reduce(g, dst=root, op=reference.reduce_op(op, factor), group=ctx.gloo)
                    if r == root:
                        msg = reference.compare(t, want, dtype_name, op, scale)
                        if msg:
                            failures.append(f"{case}: {msg}")
                        if g is not None:
                            msg = reference.compare(t, g, dtype_name, op, scale, slack=2.0)
                            if msg:
                                failures.append(f"{case} vs gloo: {msg}")
                    elif not standin and not torch.equal(t, xs[r]):
                        # torch leaves it undefined (gloo's reduce scribbles on it); ours keeps it
                        failures.append(f"{case}: a non-root's tensor changed")
            # Ops that move bytes: every root, compared with the inputs and with gloo.
            xs = [reference.make_input(ctx.gen("x", dtype_name, count, rank=q), dtype_name, count, "SUM", n)
                  for q in range(n)]
            for root in range(n):
                case = f"world={n} {dtype_name} count={count} root={root}"
                if standin and dtype_name in reference.COMPLEX_NAMES:
                    continue  # gloo's gather refuses complex tensors (its scatter takes them)
                got = [torch.empty_like(xs[r]) for _ in range(n)] if r == root else None
                dist.gather(xs[r].clone(), got, dst=root)
                ggot = [torch.empty_like(xs[r]) for _ in range(n)] if r == root else None
                gloo_ok = _gloo_or_none(lambda: dist.gather(xs[r].clone(), ggot, dst=root, group=ctx.gloo)
                                        or True)
                if r == root:
                    if not all(torch.equal(got[q], xs[q]) for q in range(n)):
                        failures.append(f"gather {case}: wrong")
                    if gloo_ok and not all(torch.equal(a, b) for a, b in zip(got, ggot)):
                        failures.append(f"gather {case}: differs from gloo")
                out = torch.empty_like(xs[r])
                dist.scatter(out, [xs[q].clone() for q in range(n)] if r == root else None, src=root)
                gout = torch.empty_like(xs[r])
                gloo_ok = _gloo_or_none(lambda: dist.scatter(
                    gout, [xs[q].clone() for q in range(n)] if r == root else None, src=root,
                    group=ctx.gloo) or True)
                # The root's list holds every rank's input, so rank r must get back xs[r].
                if not torch.equal(out, xs[r]):
                    failures.append(f"scatter {case}: rank {r} did not get its part")
                if gloo_ok and not torch.equal(out, gout):
                    failures.append(f"scatter {case}: differs from gloo")
            # alltoall with uneven splits along dim 0: rank r sends (r + 2p) % 3 rows to rank p.
            rows = lambda a, b: (a + 2 * b) % 3 + (count % 2)  # noqa: E731
            send = [rows(r, p) for p in range(n)]
            recv = [rows(p, r) for p in range(n)]
            parts = [reference.make_input(ctx.gen("a2a", dtype_name, r, p), dtype_name, k, "SUM", n)
                     for p, k in enumerate(send)]
            inp = torch.cat(parts)
            out = torch.empty(sum(recv), dtype=inp.dtype)
            dist.all_to_all_single(out, inp, recv, send)
            want = torch.cat([reference.make_input(ctx.gen("a2a", dtype_name, p, r), dtype_name, k, "SUM", n)
                              for p, k in enumerate(recv)])
            if not torch.equal(out, want):
                failures.append(f"all_to_all_single uneven world={n} {dtype_name}: wrong")
            gout = torch.empty(sum(recv), dtype=inp.dtype)
            if _gloo_or_none(lambda: dist.all_to_all_single(gout, inp, recv, send, group=ctx.gloo) or True):
                if not torch.equal(out, gout):
                    failures.append(f"all_to_all_single uneven world={n} {dtype_name}: differs from gloo")
            if standin and len(set(send + recv)) > 1:
                continue  # gloo's list all_to_all takes equal sizes only
            outs = [torch.empty(k, dtype=inp.dtype) for k in recv]
            dist.all_to_all(outs, [p.clone() for p in parts])
            if not torch.equal(torch.cat(outs), want):
                failures.append(f"all_to_all list world={n} {dtype_name}: wrong")
    return failures, digests


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_reduce_gather_scatter_alltoall(ranks, world):
    # Every dtype at every world size; the larger counts where the ring takes several slices.
    counts = [0, 1, 1009, 70001] if world <= 2 else [0, 1009, 70001]
    harness.check_results(ranks(world).run(_rank_rooted_and_alltoall, list(DTYPE_NAMES), counts,
                                           timeout=600))


def _rank_object_collectives(ctx):
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures = []
    for root in range(n):
        got = [None] * n if r == root else None
        dist.gather_object({"from": r, "pad": "x" * (r * 1000)}, got, dst=root)
        if r == root and got != [{"from": q, "pad": "x" * (q * 1000)} for q in range(n)]:
            failures.append(f"gather_object root {root}: {got!r:.200}")
        out = [None]
        dist.scatter_object_list(out, [[q, root] for q in range(n)] if r == root else None, src=root)
        if out != [[r, root]]:
            failures.append(f"scatter_object_list root {root}: {out!r}")
    return failures, {}


def test_gather_and_scatter_objects(ranks):
    harness.check_results(ranks(3).run(_rank_object_collectives, timeout=60))


def _rank_large_alltoall(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    # Past the size from which all-to-all writes its output with streaming stores, with a tail
    # that is not a multiple of the vector width.
    count = (5 << 20) + 3
    inp = torch.arange(count * n, dtype=torch.float32) + r * 0.5
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(count * r, count * (r + 1), dtype=torch.float32) + q * 0.5
                      for q in range(n)])
    failures = [] if torch.equal(out, want) else ["large all_to_all_single: wrong"]
    for root in range(n):
        b = inp.clone() if r == root else torch.zeros_like(inp)
        dist.broadcast(b, src=root)
        if not torch.equal(b, torch.arange(count * n, dtype=torch.float32) + root * 0.5):
            failures.append(f"large broadcast from {root}: wrong")
    return failures, {}


def test_large_alltoall_and_broadcast(ranks):
    harness.check_results(ranks(2).run(_rank_large_alltoall, timeout=120))


# One rank (the last) disagrees with the others on op #k; every rank must fail, and every tensor
# the call was given must be byte for byte as it was: outputs are written only once every rank is
# known to be in the same op.
DESYNC_CASES = ["all_gather_into_tensor", "all_gather", "broadcast", "broadcast_root_differs",
                "gather", "scatter", "all_to_all_single", "all_to_all", "all_reduce",
                "reduce_scatter_tensor", "reduce", "other_op"]


def _rank_desync_keeps_tensors(ctx, case, count):
    import datetime

    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    odd = r == n - 1
    g = dist.new_group(backend=ctx.backend, timeout=datetime.timedelta(seconds=20))
    c = count if not odd else count // 2 + 1  # the last rank's size
    rnd = lambda *shape: torch.randn(*shape, generator=ctx.rng)  # noqa: E731
    if case == "all_gather_into_tensor":
        ts = [rnd(c * n), rnd(c)]
        call = lambda: dist.all_gather_into_tensor(ts[0], ts[1], group=g)  # noqa: E731
    elif case == "all_gather":
        ts = [rnd(c) for _ in range(n + 1)]
        call = lambda: dist.all_gather(ts[:n], ts[n], group=g)  # noqa: E731
    elif case in ("broadcast", "broadcast_root_differs"):
        ts = [rnd(c)]
        root = 0 if case == "broadcast" else n - 1
        call = lambda: dist.broadcast(ts[0], root, group=g)  # noqa: E731
    elif case == "gather":
        ts = [rnd(c)] + ([rnd(c) for _ in range(n)] if r == 0 else [])
        call = lambda: dist.gather(ts[0], ts[1:] if r == 0 else None, dst=0, group=g)  # noqa: E731
    elif case == "scatter":
        ts = [rnd(c)] + ([rnd(c) for _ in range(n)] if r == 0 else [])
        call = lambda: dist.scatter(ts[0], ts[1:] if r == 0 else None, src=0, group=g)  # noqa: E731
    elif case in ("all_to_all_single", "all_to_all"):
        # Only one pair disagrees: the last rank sends rank 0 one element more than rank 0 expects.
        send = [count] * n
        recv = [count] * n
        if odd:
            send[0] += 1
        if case == "all_to_all_single":
            ts = [rnd(sum(recv)), rnd(sum(send))]
            call = lambda: dist.all_to_all_single(ts[0], ts[1], recv, send, group=g)  # noqa: E731
        else:
            ts = [rnd(k) for k in recv] + [rnd(k) for k in send]
            call = lambda: dist.all_to_all(ts[:n], ts[n:], group=g)  # noqa: E731
    elif case == "all_reduce":
        ts = [rnd(c)]
        call = lambda: dist.all_reduce(ts[0], group=g)  # noqa: E731
    elif case == "reduce_scatter_tensor":
        ts = [rnd(c), rnd(c * n)]
        call = lambda: dist.reduce_scatter_tensor(ts[0], ts[1], group=g)  # noqa: E731
    elif case == "reduce":
        ts = [rnd(c)]
        call = lambda: dist.reduce(ts[0], 0, group=g)  # noqa: E731
    elif case == "other_op":  # same sizes, another collective
        ts = [rnd(count * n), rnd(count)]
        if odd:
            call = lambda: dist.broadcast(ts[1], 0, group=g)  # noqa: E731
        else:
            call = lambda: dist.all_gather_into_tensor(ts[0], ts[1], group=g)  # noqa: E731
    before = [harness.digest(t) for t in ts]
    try:
        dist.all_reduce(torch.ones(4), group=g)  # op #1 agrees
        call()
        err = None
    except RuntimeError as e:
        err = str(e)
    finally:
        dist.destroy_process_group(g)
    changed = [i for i, t in enumerate(ts) if harness.digest(t) != before[i]]
    return err, changed


@pytest.mark.parametrize("world,algo", [(2, "ring"), (3, "ring"), (4, "ring"), (3, "auto")])
@pytest.mark.parametrize("count", [100, 70_000])
def test_a_desync_fails_every_rank_and_leaves_its_tensors_as_they_were(ranks, backend, world, algo,
                                                                      count):
    if backend != "ringreduce":
        pytest.skip("gloo aborts the process on a size mismatch")
    pool = ranks(world, env={"RINGREDUCE_ALGO": algo})
    bad = []
    for case in DESYNC_CASES:
        for rank, (err, changed) in enumerate(pool.run(_rank_desync_keeps_tensors, case, count,
                                                       timeout=120)):
            if err is None:
                bad.append(f"{case}: rank {rank} did not fail")
            elif "ringreduce" not in err:
                bad.append(f"{case}: rank {rank}: not ringreduce's error: {err}")
            if changed:
                bad.append(f"{case}: rank {rank} failed but its tensors {changed} were written")
    assert not bad, "\n".join(bad)

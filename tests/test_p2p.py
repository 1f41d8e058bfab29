"""Point-to-point: send/recv with tags, recv from any source, isend/irecv and batch_isend_irecv,
on every dtype and on sizes from empty to several slots, each compared with gloo on the same
inputs in the same test; receives posted in another order than the sends; sends left unmatched
until their timeout; mismatched sizes failing on both sides; shutdown with requests pending."""

from datetime import timedelta

import pytest

import harness
import reference
from reference import DTYPE_NAMES

# 0, a few elements, and sizes that take several slots (default slot 128 KiB).
COUNTS = [0, 1, 1009, 70001, 300_007]
OK_EXCEPTIONS = (RuntimeError, TimeoutError)


def _payload(ctx, dtype_name, src, dst, tag, count):
    return reference.make_input(ctx.gen("p2p", dtype_name, src, dst, tag, count), dtype_name, count,
                              "SUM", ctx.world_size)


def _exchange(ctx, group, dtype_name, counts):
    """Every rank sends to every other rank, one message per count, tags by count; receives are
    posted in the reverse order of the sends. Returns {(src, tag): received tensor}."""
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    sends, recvs, works = [], {}, []
    for dst in range(n):
        if dst == r:
            continue
        for tag, count in enumerate(counts):
            sends.append(dist.isend(_payload(ctx, dtype_name, r, dst, tag, count), dst=dst,
                                    group=group, tag=tag))
    for src in reversed(range(n)):
        if src == r:
            continue
        for tag, count in reversed(list(enumerate(counts))):
            t = torch.empty(count, dtype=reference.dtype_of(dtype_name))
            works.append(dist.irecv(t, src=src, group=group, tag=tag))
            recvs[(src, tag)] = t
    for w in works + sends:
        w.wait()
    return recvs


def _rank_send_recv_sweep(ctx, dtype_names, counts):
    import torch

    failures = []
    for dtype_name in dtype_names:
        ours = _exchange(ctx, ctx.group, dtype_name, counts)
        theirs = _exchange(ctx, ctx.gloo, dtype_name, counts)
        for (src, tag), t in ours.items():
            want = _payload(ctx, dtype_name, src, ctx.rank, tag, counts[tag])
            if not torch.equal(t, want):
                failures.append(f"{dtype_name} from rank {src} tag {tag} ({counts[tag]} elements): "
                                "wrong data")
            if not torch.equal(t, theirs[(src, tag)]):
                failures.append(f"{dtype_name} from rank {src} tag {tag}: differs from gloo")
    return failures, {}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_send_recv_every_dtype(ranks, world):
    dtypes = list(DTYPE_NAMES) if world == 2 else ["float32", "bfloat16", "int64", "bool"]
    harness.check_results(ranks(world).run(_rank_send_recv_sweep, dtypes, COUNTS, timeout=300))


def _rank_blocking_and_any_source(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures = []
    # Blocking send/recv around a ring: even ranks send first, odd ranks receive first.
    x = torch.arange(10, dtype=torch.float64) + 100 * r
    got = torch.empty(10, dtype=torch.float64)
    right, left = (r + 1) % n, (r - 1) % n
    if r % 2 == 0:
        dist.send(x, dst=right, tag=7)
        dist.recv(got, src=left, tag=7)
    else:
        dist.recv(got, src=left, tag=7)
        dist.send(x, dst=right, tag=7)
    if not torch.equal(got, torch.arange(10, dtype=torch.float64) + 100 * left):
        failures.append(f"ring send/recv: got {got.tolist()}")

    # Any source: every other rank sends its rank to rank 0, which learns who sent what.
    if r == 0:
        seen = set()
        for _ in range(n - 1):
            t = torch.empty(3, dtype=torch.int32)
            src = dist.recv(t, tag=11)
            if not torch.equal(t, torch.full((3,), src, dtype=torch.int32)):
                failures.append(f"recv from any source: rank {src} sent {t.tolist()}")
            seen.add(src)
        if seen != set(range(1, n)):
            failures.append(f"recv from any source: heard from {sorted(seen)}")
    else:
        dist.send(torch.full((3,), r, dtype=torch.int32), dst=0, tag=11)

    # Tags keep messages apart: rank 1 waits for tag 2 while tag 1, sent first, is pending.
    if r == 0:
        a = dist.isend(torch.ones(5), dst=1, tag=1)
        b = dist.isend(torch.full((5,), 2.0), dst=1, tag=2)
        a.wait()
        b.wait()
    elif r == 1:
        two, one = torch.empty(5), torch.empty(5)
        dist.recv(two, src=0, tag=2)
        dist.recv(one, src=0, tag=1)
        if not (torch.equal(one, torch.ones(5)) and torch.equal(two, torch.full((5,), 2.0))):
            failures.append(f"tags: tag 1 got {one.tolist()}, tag 2 got {two.tolist()}")

    # Strided tensors both ways; the receive writes only the elements of its view. (gloo takes
    # contiguous tensors only.)
    if r in (0, 1) and ctx.backend == "ringreduce":
        want = torch.arange(24.0).reshape(6, 4).t()  # 4x6, not contiguous
        if r == 0:
            dist.send(want, dst=1, tag=3)
        else:
            base = torch.full((6, 8), -1.0)
            view = base[:, ::2].t()  # 4x6, not contiguous
            dist.recv(view, src=0, tag=3)
            if not torch.equal(view, want) or not torch.equal(base[:, 1::2], torch.full((6, 4), -1.0)):
                failures.append("strided send/recv: wrong data")
    return failures, {}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_blocking_any_source_tags_strided(ranks, world):
    harness.check_results(ranks(world).run(_rank_blocking_and_any_source, timeout=120))


def _rank_batch(ctx, group_name):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    group = ctx.group if group_name == "ringreduce" else ctx.gloo
    out = {}
    for count in (0, 17, 200_003):
        send_r = reference.make_input(ctx.gen("batch", count, rank=r), "float32", count, "SUM", n)
        send_l = send_r * 2
        from_l, from_r = torch.empty(count), torch.empty(count)
        ops = [dist.P2POp(dist.isend, send_r, (r + 1) % n, group=group),
               dist.P2POp(dist.irecv, from_l, (r - 1) % n, group=group),
               dist.P2POp(dist.isend, send_l, (r - 1) % n, group=group),
               dist.P2POp(dist.irecv, from_r, (r + 1) % n, group=group)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        out[count] = (from_l, from_r)
    return out


def _rank_batch_vs_gloo(ctx):
    import torch

    n, r = ctx.world_size, ctx.rank
    ours, theirs = _rank_batch(ctx, "ringreduce"), _rank_batch(ctx, "gloo")
    failures = []
    for count, (from_l, from_r) in ours.items():
        l, rr = (r - 1) % n, (r + 1) % n
        want_l = reference.make_input(ctx.gen("batch", count, rank=l), "float32", count, "SUM", n)
        want_r = reference.make_input(ctx.gen("batch", count, rank=rr), "float32", count, "SUM", n) * 2
        if not torch.equal(from_l, want_l) or not torch.equal(from_r, want_r):
            failures.append(f"batch_isend_irecv count={count}: wrong data")
        if not (torch.equal(from_l, theirs[count][0]) and torch.equal(from_r, theirs[count][1])):
            failures.append(f"batch_isend_irecv count={count}: differs from gloo")
    return failures, {}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_batch_isend_irecv(ranks, world):
    harness.check_results(ranks(world).run(_rank_batch_vs_gloo, timeout=120))


def _rank_p2p_beside_collectives(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures = []
    # Large async all-reduces and sends in flight at once, on the same group.
    colls, p2p, bufs = [], [], []
    for i in range(6):
        t = torch.full((300_000,), float(r + i))
        colls.append((dist.all_reduce(t, async_op=True), t, i))
        got = torch.empty(50_000)
        p2p.append(dist.isend(torch.full((50_000,), float(100 * r + i)), dst=(r + 1) % n, tag=i))
        p2p.append(dist.irecv(got, src=(r - 1) % n, tag=i))
        bufs.append((got, i))
    for w, t, i in colls:
        w.wait()
        if not torch.equal(t, torch.full_like(t, float(sum(range(n)) + n * i))):
            failures.append(f"all_reduce #{i} beside sends: wrong")
    for w in p2p:
        w.wait()
    for got, i in bufs:
        if not torch.equal(got, torch.full_like(got, float(100 * ((r - 1) % n) + i))):
            failures.append(f"irecv tag {i} beside all_reduces: wrong")
    return failures, {}


def test_p2p_beside_collectives(ranks):
    harness.check_results(ranks(3).run(_rank_p2p_beside_collectives, timeout=120))


def _rank_errors(ctx, backend):
    import time

    import torch
    import torch.distributed as dist

    r = ctx.rank
    failures = []
    g = dist.new_group(backend=backend, timeout=timedelta(seconds=2))
    if r < 2 and backend == "ringreduce":
        # Sizes that differ: both sides fail, each saying what the other had (gloo does not check).
        try:
            if r == 0:
                dist.send(torch.zeros(10), dst=1, group=g, tag=1)
            else:
                dist.recv(torch.zeros(12), src=0, group=g, tag=1)
            failures.append("mismatched send/recv sizes did not fail")
        except OK_EXCEPTIONS as e:
            if "must agree" not in str(e) or "bytes" not in str(e):
                failures.append(f"size mismatch message: {e}")
    dist.barrier(group=ctx.gloo)
    if r < 2:
        # The channel still works afterwards.
        t = torch.full((4,), float(r))
        if r == 0:
            dist.send(t, dst=1, group=g, tag=2)
        else:
            dist.recv(t, src=0, group=g, tag=2)
            if not torch.equal(t, torch.zeros(4)):
                failures.append(f"send/recv after a mismatch: got {t.tolist()}")
    dist.barrier(group=ctx.gloo)

    if backend == "ringreduce" and r == 0:
        # Invalid peers fail at the call, naming the op and the rank.
        backend_obj = g._get_backend(torch.device("cpu"))
        for peer, want in ((5, "invalid destination"), (0, "this rank itself")):
            try:
                backend_obj.send([torch.zeros(2)], peer, 0)
                failures.append(f"send to rank {peer} did not fail")
            except RuntimeError as e:
                if want not in str(e) or "send" not in str(e) or "rank 0" not in str(e):
                    failures.append(f"send to rank {peer}: {e}")

    # Unmatched until the timeout: a recv with no send, then a send with no recv. Both fail
    # alone, and a later pair with the same tag still matches (not the abandoned send).
    t0 = time.monotonic()
    if r == 1:
        try:
            dist.recv(torch.zeros(3), src=0, group=g, tag=9)
            failures.append("a recv with no matching send did not time out")
        except OK_EXCEPTIONS as e:
            if backend == "ringreduce" and "no matching send" not in str(e):
                failures.append(f"recv timeout message: {e}")
    elif r == 0:
        try:
            dist.send(torch.full((3,), -1.0), dst=1, group=g, tag=10)
            failures.append("a send with no matching recv did not time out")
        except OK_EXCEPTIONS as e:
            if backend == "ringreduce" and "no matching recv" not in str(e):
                failures.append(f"send timeout message: {e}")
    if time.monotonic() - t0 > 20:
        failures.append(f"the unmatched send/recv took {time.monotonic() - t0:.1f}s (timeout 2s)")
    dist.barrier(group=ctx.gloo)
    if backend == "ringreduce" and r < 2:
        t = torch.full((3,), float(r))
        if r == 0:
            dist.send(t, dst=1, group=g, tag=10)
        else:
            dist.recv(t, src=0, group=g, tag=10)
            if not torch.equal(t, torch.zeros(3)):
                failures.append(f"tag 10 after the timeouts got {t.tolist()} (the abandoned send?)")
    dist.barrier(group=ctx.gloo)

    # Shutdown with a receive pending: it fails, nothing hangs.
    pending = None
    if backend == "ringreduce" and r == 1:
        pending = dist.irecv(torch.zeros(3), src=0, group=g, tag=99)
    dist.barrier(group=ctx.gloo)
    dist.destroy_process_group(g)
    if pending is not None:
        try:
            pending.wait()
            failures.append("an irecv pending at destroy_process_group completed")
        except OK_EXCEPTIONS as e:
            if "shut down" not in str(e):
                failures.append(f"pending irecv at shutdown: {e}")
    return failures, {}


def test_p2p_errors_and_timeouts(ranks, backend):
    harness.check_results(ranks(3).run(_rank_errors, backend, timeout=120))

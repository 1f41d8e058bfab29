"""Where an op runs (csrc/backend/issue.cpp, op_queue.cpp and work.cpp): an async one on the group's
progress thread, or on the thread that waits for it when its wait() (without a timeout) comes
before the progress thread has taken it; in a group of one, at its call.

- The same inputs give the same bits synchronously, async run by its wait(), and async left to the
  progress thread (a wait with a timeout leaves it there), for every kind of dtype and several ops
  and sizes.
- A synchronous all-reduce of one contiguous tensor on an idle group (and, in a group of one, an
  async one) runs at its call, and its Work comes back completed with the same result, future
  and numbering as a queued op's, or with its error for wait(). A synchronous one's Work refers to
  the caller's tensor without keeping it alive; result() and its future fail, saying so, once the
  caller has let it go.
- In a group of one a small async op returns completed; in larger groups it never runs at its
  call (tests/test_semantics.py's test_two_groups_interleaved is why: ranks may interleave groups
  differently).
- Async ops issued back to back and waited for in reverse order all complete with the right
  results (the waiting thread runs the ones queued before its own).
- A deferred async op (OpQueue::push) whose caller does not wait for it is started by the progress
  thread after the start delay, and that caller's next ops go to the thread at once; a future
  asked for, a wait with a timeout or a second op queued behind start a deferred op at once.
"""

import datetime

import pytest

import harness
import reference


def _rank_same_bits(ctx):
    import torch.distributed as dist

    r, n = ctx.rank, ctx.world_size
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

                run("sync", lambda t: dist.all_reduce(t, op=red, group=ctx.group))
                run("async, run by wait",
                    lambda t: dist.all_reduce(t, op=red, group=ctx.group, async_op=True).wait())
                run("async, progress thread",
                    lambda t: dist.all_reduce(t, op=red, group=ctx.group, async_op=True).wait(
                        timeout=datetime.timedelta(seconds=60)))
                if len(got) != 1:
                    failures.append(f"{dtype_name} {op} count={count}: rank {r}: {list(got.values())}")
    return failures, {}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_async_ops_give_the_same_bits_wherever_they_run(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    harness.check_results(ranks(world).run(_rank_same_bits, timeout=600))


def _rank_where(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures = []
    small = torch.ones(256)
    w = dist.all_reduce(small, group=ctx.group, async_op=True)
    if n == 1 and not w.is_completed():
        failures.append("a group of one did not run an async op at its call")
    w.wait()
    if not w.is_completed() or not torch.equal(small, torch.full((256,), float(n))):
        failures.append(f"rank {r}: wait() returned before the op completed, or a wrong sum")
    # Issued back to back, waited for in reverse: the last one's wait runs every op before it.
    ts = [torch.full((50000,), float(r + k)) for k in range(6)]
    works = [dist.all_reduce(t, group=ctx.group, async_op=True) for t in ts]
    for w in reversed(works):
        w.wait()
    for k, t in enumerate(ts):
        want = float(sum(p + k for p in range(n)))
        if not torch.equal(t, torch.full((50000,), want)):
            failures.append(f"rank {r}: op {k} of six waited for in reverse is wrong")
    return failures, {}


@pytest.mark.parametrize("world", [1, 2])
def test_where_async_ops_run(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    harness.check_results(ranks(world).run(_rank_where, timeout=120))


def _rank_run_at_call(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    failures = []
    g = dist.new_group(backend="ringreduce")
    be = g._get_backend(torch.device("cpu"))

    def opts(async_op, timeout=None):
        o = dist.AllreduceOptions()
        o.asyncOp = async_op
        if timeout is not None:
            o.timeout = timeout
        return o

    # A synchronous all-reduce of one contiguous tensor on an idle group runs at its call (and an
    # async one too in a group of one): its Work comes back completed, over the caller's tensor,
    # with its future's value, numbered after the ops before it.
    run_at_call = [False] + ([True] if n == 1 else [])
    for k, async_op in enumerate(run_at_call):
        t = torch.full((1000,), float(r + 1))
        w = be.allreduce([t], opts(async_op))
        what = f"rank {r}: {'async' if async_op else 'sync'} op run at its call"
        if not w.is_completed():
            failures.append(f"{what}: its Work is not completed at return")
        res = w.result()
        if len(res) != 1 or res[0] is not t:
            failures.append(f"{what}: result() is not the caller's tensor (as gloo's is)")
        val = w.get_future().wait()
        want = torch.full((1000,), float(n * (n + 1) // 2))
        if not (w.wait() and torch.equal(t, want) and torch.equal(val[0], want)):
            failures.append(f"{what}: wrong sum, or a future value that differs")
    # The Work of a synchronous op run at its call refers to the caller's tensor without keeping it
    # (or its Python object) alive: once the caller lets go of it, result() and the future say so.
    import weakref

    t = torch.full((1000,), float(r + 1))
    alive = weakref.ref(t)
    w = be.allreduce([t], opts(False))
    w.wait()
    del t
    if alive() is not None:
        failures.append(f"rank {r}: a sync op's Work keeps the caller's tensor alive")
    for name, get in (("result()", w.result), ("its future", lambda: w.get_future().wait())):
        try:
            get()
            failures.append(f"rank {r}: {name} of a sync op whose tensor is gone did not fail")
        except dist.DistBackendError as e:
            if "no longer exists" not in str(e) or f"rank {r}" not in str(e):
                failures.append(f"rank {r}: {name}: the error does not say what happened: {e}")
        except Exception as e:  # noqa: BLE001
            failures.append(f"rank {r}: {name}: not a DistBackendError: {type(e).__name__}: {e}")
    # Behind a queued async op the synchronous one does not run at its call: it runs after it
    # (the flight record's times, below).
    if n > 1:
        a = torch.full((1000,), float(r))
        aw = dist.all_reduce(a, group=g, async_op=True)
        b = torch.full((1000,), float(10 * (r + 1)))
        be.allreduce([b], opts(False)).wait()
        aw.wait()
        if len(aw.result()) != 1 or aw.result()[0] is not a:
            failures.append(f"rank {r}: a queued async op's result() is not the caller's tensor (as gloo's is)")
        if not (torch.equal(a, torch.full((1000,), float(sum(range(n)))))
                and torch.equal(b, torch.full((1000,), float(10 * n * (n + 1) // 2)))):
            failures.append(f"rank {r}: a sync op behind a queued async one: wrong sums")
    # The flight recorder numbers and records them as it does queued ops.
    import json
    import tempfile

    import ringreduce

    with tempfile.TemporaryDirectory() as directory:
        with open(ringreduce.dump_flight_recorder(g, directory)) as f:
            ops = json.load(f)["ops"]
    got = [(o["seq"], o["op"], o["shapes"], o["state"]) for o in ops]
    expect = [(k, "allreduce", "[1000]", "completed") for k in range(len(run_at_call) + 1 + 2 * (n > 1))]
    if got != expect:
        failures.append(f"rank {r}: flight record {got}, expected {expect}")
    elif n > 1 and ops[-2]["ended_us"] > ops[-1]["started_us"]:
        failures.append(f"rank {r}: the sync op started before the async one queued ahead of it ended: "
                        f"{ops[-2:]}")
    # An op run at its call that fails hands its error to wait(), as a queued one does, and leaves
    # the caller's tensor as it was: rank 0 alone calls it, and its deadline passes.
    dist.barrier(group=ctx.gloo)
    if r == 0 and n > 1:
        t = torch.full((1000,), 5.0)
        try:
            w = be.allreduce([t], opts(False, datetime.timedelta(seconds=1)))
        except Exception as e:  # noqa: BLE001
            failures.append(f"the failing op raised at its call, not at wait(): {e}")
        else:
            try:
                w.wait()
                failures.append("a sync op that no peer joined completed")
            except dist.DistBackendError as e:
                if "allreduce" not in str(e) or "rank 0" not in str(e):
                    failures.append(f"the error does not name the op and the rank: {e}")
            if not torch.equal(t, torch.full((1000,), 5.0)):
                failures.append("the failed op changed the caller's tensor")
    dist.barrier(group=ctx.gloo)
    if n > 1:
        dist.destroy_process_group(g)  # aborted on rank 0: torn down, not used again
    return failures, {}


@pytest.mark.parametrize("world", [1, 2])
def test_ops_run_at_their_call(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    harness.check_results(ranks(world).run(_rank_run_at_call, timeout=120))


def _rank_wait_runs_only_its_own(ctx):
    import threading
    import time

    import torch
    import torch.distributed as dist

    r = ctx.rank
    failures = []
    for it in range(8):
        # A short timeout on G: the fault shows as G's second op timing out, not as a hang.
        g = dist.new_group(backend="ringreduce", timeout=datetime.timedelta(seconds=3))
        h = dist.new_group(backend="ringreduce")
        ta, tb, th = (torch.full((64,), float(r + 1)) for _ in range(3))
        t0 = time.monotonic()
        errors = []
        try:
            if r == 0:
                # Another thread runs `a` at its wait() (deferred, so it runs there) while this
                # one queues `b` behind it and waits for `a` too. When `a` ends, `b` must be left
                # to the progress thread: this thread goes on to its op on H, which rank 1 needs
                # before it issues `b` (groups may interleave differently from rank to rank).
                a = dist.all_reduce(ta, group=g, async_op=True)
                runner = threading.Thread(target=lambda: a.wait())
                runner.start()
                time.sleep(0.05)  # sleep-ok: lets the runner thread take `a` first; Python cannot see that it has, and if it has not, the round still passes
                b = dist.all_reduce(tb, group=g, async_op=True)
                a.wait()
                dist.all_reduce(th, group=h)
                b.wait()
                runner.join()
            else:
                time.sleep(0.2)  # sleep-ok: rank 1 comes late on purpose, so that rank 0's `a` is running on its runner thread while `b` queues behind it
                a = dist.all_reduce(ta, group=g, async_op=True)
                dist.all_reduce(th, group=h)
                b = dist.all_reduce(tb, group=g, async_op=True)
                a.wait()
                b.wait()
        except Exception as e:  # noqa: BLE001 (the failure is the finding)
            errors.append(str(e).splitlines()[0])
        took = time.monotonic() - t0
        if errors or took > 2.0:
            failures.append(f"rank {r}: round {it}: a wait() ran an op queued after its own "
                            f"({took:.2f} s; {errors})")
            break
        for name, t in (("a", ta), ("b", tb), ("h", th)):
            if not torch.equal(t, torch.full((64,), 3.0)):
                failures.append(f"rank {r}: round {it}: op {name} wrong: {t[0].item()}")
        dist.destroy_process_group(g)
        dist.destroy_process_group(h)
    return failures, {}


def test_a_wait_runs_no_op_queued_after_its_own(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    harness.check_results(ranks(2).run(_rank_wait_runs_only_its_own, timeout=120))


# The start delay of the pools below: long, so that an op the timer starts and one started at once
# differ by far more than any scheduling delay, and a deferred op waits for its wait().
_DELAY_S = 1.0
_LONG_DELAY = {"RINGREDUCE_ASYNC_START_US": str(int(_DELAY_S * 1e6))}


def _rank_deferred(ctx):
    import time

    import torch
    import torch.distributed as dist

    r = ctx.rank
    g = dist.new_group(backend="ringreduce")  # a fresh queue: it starts out deferring
    failures = []
    count = [0]

    def one_round(rank0_waits, rank0_issues=1):
        """Rank 0 issues its op(s) and waits for them with `rank0_waits` (None: not at all before a
        gloo barrier that rank 1 reaches only after its own wait() returned). Returns how long
        rank 1's wait() took, which is how long rank 0's op took to start."""
        count[0] += 1
        ts = [torch.full((64,), float(r + 1)) for _ in range(rank0_issues)]
        took = None
        if r == 0:
            works = [dist.all_reduce(t, group=g, async_op=True) for t in ts]
            if rank0_waits is not None:
                for w in works:
                    rank0_waits(w)
            dist.barrier(group=ctx.gloo)
            for w in works:
                w.wait()
        else:
            works = [dist.all_reduce(t, group=g, async_op=True) for t in ts]
            t0 = time.monotonic()
            for w in works:
                w.wait()
            took = time.monotonic() - t0
            dist.barrier(group=ctx.gloo)
        for t in ts:
            if not torch.equal(t, torch.full((64,), 3.0)):
                failures.append(f"rank {r}: round {count[0]}: wrong sum {t[0].item()}")
        return took

    def prompt_again():
        t = torch.ones(64)
        for _ in range(8):
            dist.all_reduce(t, group=g, async_op=True).wait()

    # Never waited for: only the progress thread can start rank 0's op, once the delay has passed.
    took = one_round(None)
    if r == 1 and took < 0.5 * _DELAY_S:
        failures.append(f"an op its caller did not wait for started after {took:.3f} s, not deferred")
    # That caller overlaps its ops with its work: its next op goes to the thread at once.
    took = one_round(None)
    if r == 1 and took > 0.5 * _DELAY_S:
        failures.append(f"after a deferred op ran late, the next one still waited {took:.3f} s")
    # Prompt waits make the group defer again; a future asked for, a wait with a timeout and a
    # second op queued behind each start a deferred op at once.
    cases = [
        ("its future waited for", lambda w: w.get_future().wait(), 1),
        ("a wait with a timeout", lambda w: w.wait(timeout=datetime.timedelta(seconds=30)), 1),
        ("a second op queued behind it", None, 2),
    ]
    for name, waits, issues in cases:
        prompt_again()
        took = one_round(waits, issues)
        if r == 1 and took > 0.5 * _DELAY_S:
            failures.append(f"a deferred op whose caller did this: {name}: started after {took:.3f} s")
    dist.destroy_process_group(g)
    return failures, {}


def test_a_deferred_async_op_starts_when_its_caller_does_not_run_it(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    harness.check_results(ranks(2, env=_LONG_DELAY).run(_rank_deferred, timeout=120))


# The growing delay's pool: a start delay short enough that prompt ops span several of them in a
# second or two, long enough that the scheduler's delays are small beside it.
_BASE_S = 0.2
_GROWTH = 8  # kDeferGrowth in csrc/backend/op_queue.h


def _rank_delay_grows(ctx):
    import time

    import torch
    import torch.distributed as dist

    r = ctx.rank
    g = dist.new_group(backend="ringreduce")
    failures = []

    def unwaited_round():
        """Rank 0 issues an async op and does not wait for it before a gloo barrier that rank 1
        reaches only after its own wait() returned: how long that wait took is how long rank 0's
        progress thread left the op deferred."""
        t = torch.full((64,), float(r + 1))
        w = dist.all_reduce(t, group=g, async_op=True)
        took = None
        if r == 0:
            dist.barrier(group=ctx.gloo)
            w.wait()
        else:
            t0 = time.monotonic()
            w.wait()
            took = time.monotonic() - t0
            dist.barrier(group=ctx.gloo)
        if not torch.equal(t, torch.full((64,), 3.0)):
            failures.append(f"rank {r}: wrong sum {t[0].item()}")
        return took

    def prompt_for(seconds):
        t = torch.ones(64)
        stop = torch.zeros(1)
        end = time.monotonic() + seconds
        while True:  # both ranks stop at the same op: rank 0 decides
            for _ in range(50):
                dist.all_reduce(t, group=g, async_op=True).wait()
            stop.fill_(1.0 if r == 0 and time.monotonic() > end else 0.0)
            dist.all_reduce(stop, group=g, async_op=True).wait()
            if stop.item() > 0:
                return

    # Prompt waits over several delays: each firing of the timer finds nothing due, and the delay
    # in force doubles (0.2, 0.4, 0.8 s ... up to 1.6 s).
    prompt_for(5 * _BASE_S)
    took = unwaited_round()
    if r == 1 and not 1.5 * _BASE_S < took < _GROWTH * _BASE_S + 1.0:
        failures.append(f"after prompt waits over several delays, an unwaited op started after "
                        f"{took:.3f} s: expected more than {1.5 * _BASE_S:.2f} s (the delay grown) and "
                        f"at most about {_GROWTH * _BASE_S:.2f} s ({_GROWTH}x the start delay)")
    # That op ran late: the next one goes to the thread at once, and once the caller waits promptly
    # again (not long enough for the timer to fire), the delay is the start delay again.
    took = unwaited_round()
    if r == 1 and took > 0.5 * _BASE_S:
        failures.append(f"after a deferred op ran late, the next one still waited {took:.3f} s")
    # (Many ops, so that four prompt waits in a row come even on a loaded machine; still far
    # shorter than the delay, so that the timer does not fire meanwhile.)
    t = torch.ones(64)
    for _ in range(100):
        dist.all_reduce(t, group=g, async_op=True).wait()
    took = unwaited_round()
    if r == 1 and not 0.5 * _BASE_S < took < 1.5 * _BASE_S:
        failures.append(f"after a deferred op ran late, the delay should be back at {_BASE_S} s; "
                        f"an unwaited op started after {took:.3f} s")
    dist.destroy_process_group(g)
    return failures, {}


def test_the_start_delay_grows_while_callers_wait_promptly(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    env = {"RINGREDUCE_ASYNC_START_US": str(int(_BASE_S * 1e6))}
    harness.check_results(ranks(2, env=env).run(_rank_delay_grows, timeout=120))


def _rank_moved_before_wait(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    g = dist.new_group(backend="ringreduce")
    failures = []
    total = float(n * (n + 1) // 2)
    t = torch.ones(64)
    for _ in range(8):  # prompt waits: the group defers its next async op to its wait()
        dist.all_reduce(t, group=g, async_op=True).wait()
    # share_memory_ moves a storage's memory in place (no storage pin can stop it) while the op
    # waits for its wait(): the op works on the memory the storage has when it runs, and unpinning
    # it afterwards leaves it as torch needs a shared storage (not resizable: it has no allocator).
    for shape in [(1000,), (7, 33)]:
        t = torch.full(shape, float(r + 1))
        w = dist.all_reduce(t, group=g, async_op=True)
        t.share_memory_()
        w.wait()
        if not (t.is_shared() and torch.equal(t, torch.full(shape, total))):
            failures.append(f"rank {r}: {shape}: moved into shared memory before wait(): "
                            f"{t.flatten()[:3].tolist()}, expected {total}")
        try:
            t.resize_(4000)
            failures.append(f"rank {r}: a shared storage became resizable")
        except RuntimeError:
            pass
    dist.destroy_process_group(g)
    return failures, {}


def test_an_async_op_finds_its_tensor_moved_into_shared_memory(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's call path")
    harness.check_results(ranks(2, env=_LONG_DELAY).run(_rank_moved_before_wait, timeout=120))

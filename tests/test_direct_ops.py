"""The direct ops for inference loops: torch.ops.ringreduce.all_reduce_ and
all_gather_into_tensor_, and their Python wrappers ringreduce.all_reduce_ and
ringreduce.all_gather_into_tensor_ (csrc/backend/direct_ops.cpp, ringreduce/direct.py).

- Against dist.all_reduce / dist.all_gather_into_tensor on the same inputs, bit for bit: every
  dtype and op, worlds 1, 2 and 4, contiguous and not, the default group and another group.
- Traced by torch.compile with fullgraph=True, and run.
- The version of the tensor they write moves, as an in-place op's does, so autograd refuses a
  backward that saved it; dispatch modes and the profiler see the wrappers' calls.
- Bad calls fail with errors that name the op: an unknown op, a group that does not exist.
- A desync between the direct op and the backend path fails every rank; a rank killed inside the
  direct op fails every survivor, naming it.
"""

import os

import pytest

import harness
import reference
from reference import DTYPE_NAMES, ops_for

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_OP_NAMES = {"SUM": "sum", "AVG": "avg", "PRODUCT": "product", "MIN": "min", "MAX": "max",
             "BAND": "band", "BOR": "bor", "BXOR": "bxor"}


def _rank_bits(ctx):
    import torch
    import torch.distributed as dist
    import ringreduce

    r, n = ctx.rank, ctx.world_size
    other = dist.new_group(backend="ringreduce")
    failures = []
    for dtype_name in DTYPE_NAMES:
        for op in ops_for(dtype_name):
            # torch's dist.all_reduce refuses PRODUCT on complex tensors before any backend sees it.
            if op not in _OP_NAMES or (dtype_name.startswith("complex") and op == "PRODUCT"):
                continue
            for count in (0, 1, 1009, 70001):
                for layout in ("contiguous", "strided"):
                    for g in (None, other):
                        x = reference.make_input(ctx.gen("direct", dtype_name, op, count, layout, rank=r),
                                                 dtype_name, count * (2 if layout == "strided" else 1), op, n)
                        a, b = x.clone(), x.clone()
                        va = a[::2] if layout == "strided" else a
                        vb = b[::2] if layout == "strided" else b
                        dist.all_reduce(va, op=reference.reduce_op(op), group=g or dist.group.WORLD)
                        ringreduce.all_reduce_(vb, op=_OP_NAMES[op], group=g)
                        if harness.digest(a) != harness.digest(b):
                            failures.append(f"all_reduce_ {dtype_name} {op} count={count} {layout} "
                                            f"group={'other' if g else 'default'}: rank {r} differs")
        inp = reference.make_input(ctx.gen("ag", dtype_name, rank=r), dtype_name, 1009, "SUM", n)
        want = torch.empty(1009 * n, dtype=inp.dtype)
        dist.all_gather_into_tensor(want, inp)
        got = torch.empty_like(want)
        ringreduce.all_gather_into_tensor_(got, inp)
        got2 = torch.empty_like(want)
        torch.ops.ringreduce.all_gather_into_tensor_(got2, inp, other.group_name)
        if not (harness.digest(got) == harness.digest(want) == harness.digest(got2)):
            failures.append(f"all_gather_into_tensor_ {dtype_name}: rank {r} differs")
    # The schema's own names: the op given as torch.distributed.ReduceOp too.
    t = torch.full((5,), float(r + 1))
    ringreduce.all_reduce_(t, op=dist.ReduceOp.MAX)
    if not torch.equal(t, torch.full((5,), float(n))):
        failures.append(f"rank {r}: ReduceOp.MAX gave {t}")
    dist.destroy_process_group(other)
    return failures, {}


@pytest.mark.parametrize("world", [1, 2, 4])
def test_direct_ops_give_the_backend_paths_bits(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's direct ops")
    harness.check_results(ranks(world).run(_rank_bits, timeout=600))


def _rank_compiled(ctx):
    import torch
    import ringreduce

    r, n = ctx.rank, ctx.world_size

    def layer(x, w):
        y = x @ w
        ringreduce.all_reduce_(y)
        out = torch.empty(y.numel() * n, dtype=y.dtype)
        ringreduce.all_gather_into_tensor_(out, y.reshape(-1))
        return torch.relu(y), out

    x = torch.randn(4, 8, generator=ctx.gen("x"))  # the same on every rank
    w = torch.randn(8, 8, generator=ctx.gen("w", rank=r))
    eager = layer(x, w)
    fn = torch.compile(layer, fullgraph=True, backend="aot_eager")
    compiled = fn(x, w)
    failures = []
    for e, c in zip(eager, compiled):
        if not torch.equal(e, c):
            failures.append(f"rank {r}: compiled and eager differ")
    # Compiled once: later calls run the same graph (a guard on how the wrapper tells a trace from an
    # eager call recompiled every call, until the recompile limit failed the fullgraph function).
    import torch._dynamo

    with torch._dynamo.config.patch(error_on_recompile=True):
        try:
            for _ in range(12):
                again = fn(x, w)
        except Exception as e:  # noqa: BLE001
            failures.append(f"rank {r}: a later call of the compiled function recompiled: {str(e).splitlines()[0]}")
        else:
            if not all(torch.equal(e, c) for e, c in zip(eager, again)):
                failures.append(f"rank {r}: a later compiled call differs from eager")
    return failures, {}


@pytest.mark.parametrize("world", [1, 2])
def test_direct_ops_compile_with_fullgraph(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's direct ops")
    harness.check_results(ranks(world).run(_rank_compiled, timeout=300))


def _rank_versions(ctx):
    import torch
    import ringreduce

    failures = []
    n = ctx.world_size
    t = torch.ones(4)
    v = t._version
    ringreduce.all_reduce_(t)
    out = torch.empty(4 * n)
    w = out._version
    ringreduce.all_gather_into_tensor_(out, torch.ones(4))
    if (t._version - v, out._version - w) != (1, 1):
        failures.append(f"rank {ctx.rank}: versions moved by {t._version - v} and {out._version - w}, not 1")
    # sigmoid's backward uses its output: once the op has written over it, backward refuses.
    x = torch.randn(4, requires_grad=True)
    y = x.sigmoid()
    ringreduce.all_reduce_(y)
    try:
        y.sum().backward()
        failures.append(f"rank {ctx.rank}: backward ran on a saved tensor the op wrote over")
    except RuntimeError as e:
        if "modified by an inplace operation" not in str(e):
            failures.append(f"rank {ctx.rank}: unexpected error {e}")
    # Under no_grad and in inference mode the op runs as before.
    with torch.inference_mode():
        u = torch.ones(4)
        ringreduce.all_reduce_(u)
    if not torch.equal(u, torch.full((4,), float(n))):
        failures.append(f"rank {ctx.rank}: inference-mode result {u}")
    # The wrappers call the ops' dispatcher entries straight: Python dispatch modes and the
    # profiler see both ops, as they see a call through torch.ops.
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen() as seen:
        ringreduce.all_reduce_(torch.ones(4))
        ringreduce.all_gather_into_tensor_(torch.empty(4 * n), torch.ones(4))
    want = ["ringreduce.all_reduce_.default", "ringreduce.all_gather_into_tensor_.default"]
    if [o for o in seen.ops if o.startswith("ringreduce.")] != want:
        failures.append(f"rank {ctx.rank}: a dispatch mode saw {seen.ops}, not {want}")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        ringreduce.all_reduce_(torch.ones(4))
    names = {e.name for e in prof.events()}
    if "ringreduce::all_reduce_" not in names:
        failures.append(f"rank {ctx.rank}: the profiler saw no ringreduce::all_reduce_ among {sorted(names)[:20]}")
    return failures, {}


def test_the_direct_ops_bump_the_version_of_what_they_write(ranks, backend):
    """As torch's own in-place ops do: a backward that saved the tensor refuses to use what the
    op wrote over it, instead of computing a wrong gradient. And the Python wrappers, which call
    the ops' dispatcher entries without torch.ops' Python layers, still reach dispatch modes and
    the profiler."""
    if backend != "ringreduce":
        pytest.skip("ringreduce's direct ops")
    harness.check_results(ranks(2).run(_rank_versions, timeout=120))


def _rank_bad_calls(ctx):
    import torch
    import ringreduce

    failures = []
    for call, want in ((lambda: ringreduce.all_reduce_(torch.ones(3), op="mean"), "not one of sum"),
                       (lambda: torch.ops.ringreduce.all_reduce_(torch.ones(3), "mean", ""), "'mean' is not one of"),
                       (lambda: torch.ops.ringreduce.all_reduce_(torch.ones(3), "sum", "no-such-group"),
                        "no process group named 'no-such-group'")):
        try:
            call()
            failures.append(f"rank {ctx.rank}: no error for {want!r}")
        except (RuntimeError, ValueError) as e:
            if want not in str(e):
                failures.append(f"rank {ctx.rank}: expected {want!r} in {e}")
    # The group still works after the refused calls (nothing was issued).
    t = torch.ones(3)
    ringreduce.all_reduce_(t)
    if not torch.equal(t, torch.full((3,), float(ctx.world_size))):
        failures.append(f"rank {ctx.rank}: the group is off after refused calls")
    return failures, {}


def test_bad_direct_calls_fail_naming_what_was_wrong(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's direct ops")
    harness.check_results(ranks(2).run(_rank_bad_calls, timeout=120))


WORKER = r'''
import json, os, signal, threading, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ringreduce

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
case, out = os.environ["CASE"], os.environ["OUT"]
dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
res = {"rank": rank}
ringreduce.all_reduce_(torch.ones(16))
try:
    if case == "kill":
        if rank == world - 1:
            def die():
                threading.Event().wait(0.3)
                with open(os.path.join(out, "death"), "w") as f:
                    f.write(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Thread(target=die, daemon=True).start()
        t = torch.ones(int(os.environ["COUNT"]))
        for _ in range(10_000_000):
            ringreduce.all_reduce_(t)
        res["error"] = "no all-reduce failed"
    else:  # rank 0 calls the direct all-reduce where the others broadcast
        if rank == 0:
            ringreduce.all_reduce_(torch.ones(256))
        else:
            dist.broadcast(torch.ones(256), 0)
        res["error"] = "the mismatched op did not fail"
except Exception as e:
    res["error"] = str(e)
res["t_error"] = time.time()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
os._exit(0)
'''


def _run(tmp_path, world, case, env):
    return harness.launch_script_ranks(tmp_path, world, WORKER, case, env)


@pytest.mark.parametrize("count", [256, 1_000_000])
def test_a_rank_killed_inside_the_direct_op_fails_every_survivor(tmp_path, backend, count):
    if backend != "ringreduce":
        pytest.skip("ringreduce's direct ops")
    world = 3
    results, _, why = _run(tmp_path, world, "kill", {"COUNT": str(count)})
    died = float((tmp_path / "death").read_text())
    for rank in range(world - 1):
        err = results[rank]["error"]
        assert "allreduce #" in err and f"rank {world - 1}" in err and "died" in err, why
        assert results[rank]["t_error"] - died < 10, why


def test_a_desync_between_the_direct_op_and_the_backend_path_fails_every_rank(tmp_path, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's direct ops")
    world = 3
    results, start, why = _run(tmp_path, world, "desync", {})
    for rank in range(world):
        assert rank in results, f"rank {rank} wrote no result\n{why}"
        err = results[rank]["error"]
        assert "called different collectives" in err and "#1" in err, why
        assert results[rank]["t_error"] - start < 45, why

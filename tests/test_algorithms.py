"""The algorithm layer: ring, one-shot and two-shot all-reduce, each forced in turn.

- Every algorithm over sizes around the crossovers, every dtype and op, in place and async:
  against the float64 reference and gloo, and bit-identical on every rank (run_cases of
  test_allreduce), with the algorithm forced through the backend's set_algorithm; and the three
  give the same bits on the same inputs (each folds in the ring's order).
- The automatic choice: the same on every rank, one-shot for the smallest sizes, the ring for
  the largest, and what RINGREDUCE_ALGO forces.
- Small broadcast, all_gather, reduce_scatter, reduce and barrier through the window against
  gloo, and several groups used in turn.
- Faults: a rank killed inside a one-shot or two-shot all-reduce fails every survivor fast; ranks
  that call different collectives (a window op against another window op, or against a ring op)
  fail on every rank with "called different collectives" long before the timeout.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import harness
import reference
from reference import DTYPE_NAMES, ops_for
from test_allreduce import run_cases

ALGOS = ("ring", "oneshot", "twoshot")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _counts(world):
    # 0, 1, fewer elements than ranks, a prime, and sizes around the one-shot (16-64 KiB) and
    # two-shot (1 MiB, the window) crossovers of float32.
    return list(dict.fromkeys([0, 1, world - 1, 1009, 4093, 16411, 65537, 262147]))


def _backend(group):
    import torch

    return group._get_backend(torch.device("cpu"))


def _rank_forced(ctx, algo, dtype_names):
    be = _backend(ctx.group)
    be.set_algorithm(algo)
    failures, digests = [], {}
    try:
        for dtype_name in dtype_names:
            # Async ops run the same algorithm from the queue: at world 2 only, for make test's time.
            modes = ("sync", "async") if ctx.world_size == 2 else ("sync",)
            cases = [(count, op, mode, None) for count in _counts(ctx.world_size)
                     for op in ops_for(dtype_name) for mode in modes]
            f, d = run_cases(ctx, dtype_name, cases)
            failures += [f"{algo}: {x}" for x in f]
            digests.update({f"{algo} {k}": v for k, v in d.items()})
    finally:
        be.set_algorithm("auto")
    return failures, digests


# The ring at worlds 3 and 4 is what every size takes over TCP, where test_collectives runs again
# (make test's TCP pass) with every dtype and op.
FORCED = [(2, a) for a in ALGOS] + [(w, a) for w in (3, 4) for a in ALGOS if a != "ring"]


@pytest.mark.parametrize("world,algo", FORCED, ids=[f"world{w}-{a}" for w, a in FORCED])
def test_each_algorithm_every_dtype_and_op(ranks, backend, world, algo):
    if backend != "ringreduce":
        pytest.skip("ringreduce's algorithms")
    harness.check_results(ranks(world).run(_rank_forced, algo, DTYPE_NAMES, timeout=600))


def _rank_same_bits(ctx):
    import torch
    import torch.distributed as dist

    be = _backend(ctx.group)
    failures = []
    try:
        for dtype_name in ("float32", "float64", "float16", "bfloat16", "int32", "complex64"):
            for op in ("SUM", "AVG", "MAX", "PRODUCT"):
                if op not in ops_for(dtype_name) or (dtype_name == "complex64" and op == "PRODUCT"):
                    continue
                for count in (5, 1009, 30011):
                    x = reference.make_input(ctx.gen("same", dtype_name, op, count, rank=ctx.rank),
                                           dtype_name, count, op, ctx.world_size)
                    got = {}
                    for algo in ALGOS:
                        be.set_algorithm(algo)
                        t = x.clone()
                        dist.all_reduce(t, op=reference.reduce_op(op), group=ctx.group)
                        got[algo] = harness.digest(t)
                    if len(set(got.values())) != 1:
                        failures.append(f"{dtype_name} {op} count={count}: the algorithms' bits differ on rank {ctx.rank}")
    finally:
        be.set_algorithm("auto")
    return failures, {}


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_algorithm_gives_the_rings_bits(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's algorithms")
    harness.check_results(ranks(world).run(_rank_same_bits, timeout=300))


def _rank_choices(ctx, sizes):
    be = _backend(ctx.group)
    return [], {"choices": json.dumps([be.algorithm(op, s) for op in ("allreduce", "broadcast",
                                                                         "allgather", "reduce_scatter",
                                                                         "reduce", "barrier")
                                       for s in sizes]),
                "allreduce": json.dumps([be.algorithm("allreduce", s) for s in sizes]),
                "table": be.algorithms}


@pytest.mark.parametrize("world", [2, 4])
def test_the_automatic_choice_is_the_same_on_every_rank(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's algorithms")
    sizes = [0, 1024, 65536, 1 << 20, 64 << 20]
    results = ranks(world).run(_rank_choices, sizes, timeout=60)
    harness.check_results(results)  # also: every digest the same on every rank
    chosen = json.loads(results[0][1]["allreduce"])
    assert chosen[1] == "oneshot", results[0][1]
    assert chosen[-1] == "ring", results[0][1]
    assert "twoshot" in chosen, results[0][1]
    assert "oneshot<=" in results[0][1]["table"], results[0][1]


def test_the_environment_forces_an_algorithm_and_tcp_has_no_window(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's algorithms")
    for env, want in (({"RINGREDUCE_ALGO": "twoshot"}, "twoshot"),
                      ({"RINGREDUCE_ALGO": "ring"}, "ring"),
                      ({"RINGREDUCE_TRANSPORT": "tcp"}, "ring"),
                      ({"RINGREDUCE_WINDOW_BYTES": "0"}, "ring")):
        results = ranks(2, env=env).run(_rank_choices, [1024, 65536], timeout=60)
        for _, d in results:
            assert json.loads(d["allreduce"]) == [want, want], (env, d)


def _rank_other_collectives(ctx, algo):
    import torch
    import torch.distributed as dist

    be = _backend(ctx.group)
    be.set_algorithm(algo)
    n, r = ctx.world_size, ctx.rank
    failures = []
    try:
        for count in (0, 1, 7, 1009, 20000):
            for root in range(n):
                x = torch.randn(count, generator=ctx.gen("b", count, root, rank=root))
                t = x.clone() if r == root else torch.full((count,), float("nan"))
                dist.broadcast(t, root, group=ctx.group)
                if not torch.equal(t, x):
                    failures.append(f"{algo} broadcast count={count} root={root}: wrong on rank {r}")
            mine = torch.randint(-50, 50, (count,), generator=ctx.gen("g", count, rank=r)).float()
            out = torch.empty(count * n)
            dist.all_gather_into_tensor(out, mine, group=ctx.group)
            want = torch.cat([torch.randint(-50, 50, (count,), generator=ctx.gen("g", count, rank=p)).float()
                              for p in range(n)])
            if not torch.equal(out, want):
                failures.append(f"{algo} all_gather count={count}: wrong on rank {r}")
            ins = [torch.randint(-50, 50, (count * n,), generator=ctx.gen("rs", count, rank=p)).float()
                   for p in range(n)]
            got = torch.empty(count)
            dist.reduce_scatter_tensor(got, ins[r].clone(), group=ctx.group)
            g = torch.empty(count)
            dist.reduce_scatter_tensor(g, ins[r].clone(), group=ctx.gloo)
            if not torch.equal(got, g) or not torch.equal(got, sum(ins)[r * count:(r + 1) * count]):
                failures.append(f"{algo} reduce_scatter count={count}: differs from gloo on rank {r}")
            for root in range(n):
                t = ins[r][:count].clone()
                dist.reduce(t, root, op=dist.ReduceOp.MAX, group=ctx.group)
                if r == root and not torch.equal(t, torch.stack([i[:count] for i in ins]).max(0).values):
                    failures.append(f"{algo} reduce count={count} root={root}: wrong")
            dist.barrier(group=ctx.group)
    finally:
        be.set_algorithm("auto")
    return failures, {}


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("algo", ["ring", "oneshot"])
def test_small_broadcast_gather_scatter_reduce_barrier(ranks, backend, world, algo):
    if backend != "ringreduce":
        pytest.skip("ringreduce's algorithms")
    harness.check_results(ranks(world).run(_rank_other_collectives, algo, timeout=300))


def _rank_groups(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    groups = [dist.new_group(backend="ringreduce") for _ in range(3)]
    for i, g in enumerate(groups):
        _backend(g).set_algorithm(ALGOS[i])
    failures = []
    works = []
    for step in range(30):
        for i, g in enumerate(groups):
            t = torch.full((1000 + 97 * i,), float(r + step + i))
            works.append((dist.all_reduce(t, group=g, async_op=True), t, float(sum(range(n)) + n * (step + i))))
    for w, t, want in works:
        w.wait()
        if not bool((t == want).all()):
            failures.append(f"rank {r}: got {t[0].item()}, want {want}")
    for g in groups:
        dist.destroy_process_group(g)
    return failures[:5], {}


def test_several_groups_at_once(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's algorithms")
    harness.check_results(ranks(4).run(_rank_groups, timeout=120))


WORKER = r'''
import json, os, signal, sys, threading, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ringreduce  # noqa: F401

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
case, out = os.environ["CASE"], os.environ["OUT"]
dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
res = {"rank": rank}
dist.all_reduce(torch.ones(16))
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
            dist.all_reduce(t)
        res["error"] = "no all-reduce failed"
    else:  # desync: rank 0 disagrees with the others on op #1
        small = rank == 0
        if case == "window-window":
            t = torch.ones(1000 if small else 2000)
            dist.all_reduce(t)
        elif case == "window-ring":
            t = torch.ones(256 if small else 4 << 20)
            dist.all_reduce(t)
        elif case == "window-broadcast":
            t = torch.ones(256)
            if small:
                dist.all_reduce(t)
            else:
                dist.broadcast(torch.ones(4 << 20), 0)
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


@pytest.mark.parametrize("algo,count", [("oneshot", 256), ("twoshot", 100_000)])
def test_a_rank_killed_inside_a_window_all_reduce_fails_every_survivor(tmp_path, backend, algo, count):
    if backend != "ringreduce":
        pytest.skip("ringreduce's faults")
    world = 3
    shm_before = {n for n in os.listdir("/dev/shm") if n.startswith("ringreduce-")}
    results, _, why = _run(tmp_path, world, "kill", {"RINGREDUCE_ALGO": algo, "COUNT": str(count)})
    died = float((tmp_path / "death").read_text())
    for rank in range(world - 1):
        err = results[rank]["error"]
        assert "allreduce #" in err and f"rank {world - 1}" in err and "died" in err, why
        assert results[rank]["t_error"] - died < 10, why
    assert not {n for n in os.listdir("/dev/shm") if n.startswith("ringreduce-")} - shm_before


@pytest.mark.parametrize("case", ["window-window", "window-ring", "window-broadcast"])
def test_ranks_in_different_ops_fail_fast_on_every_rank(tmp_path, backend, case):
    if backend != "ringreduce":
        pytest.skip("ringreduce's faults")
    world = 3
    results, start, why = _run(tmp_path, world, case, {})
    for rank in range(world):
        err = results[rank]["error"]
        assert "called different collectives" in err and "#1" in err, why
        assert results[rank]["t_error"] - start < 45, why  # the timeout is 60 s

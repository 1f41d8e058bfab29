"""The hierarchical all-reduce, on one machine: RINGREDUCE_FAKE_HOSTS cuts the ranks into "hosts"
of consecutive ranks that talk over TCP (tests/test_netns.py runs it between real network
namespaces).

- Every dtype and op, sizes from 0 to more than a slice, in place and async: against the float64
  reference and gloo, bit-identical on every rank; 2 hosts x 2 ranks and 2 hosts x 3 ranks.
- The choice: hierarchical for every all-reduce where hosts have as many ranks each, the ring where
  they do not (or with one rank per host), and what set_algorithm / RINGREDUCE_ALGO force.
- Faults: a rank killed at the start of each of the three phases fails every survivor fast,
  naming the dead rank or the abort, and leaves nothing in /dev/shm; ranks whose algorithms
  differ fail as a desync.
"""

import json
import os
import subprocess
import sys
import time

import pytest

import harness
from reference import DTYPE_NAMES, ops_for
from test_allreduce import run_cases

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _backend(group):
    import torch

    return group._get_backend(torch.device("cpu"))


def _counts(world):
    # Empty, fewer elements than ranks on a host, a prime, and more than one 128-512 KiB slice
    # per chunk in each phase.
    return [0, 1, 2, 5, 1009, 300007]


def _rank_every_dtype(ctx, dtype_names):
    be = _backend(ctx.group)
    failures, digests = [], {}
    chosen = be.algorithm("allreduce", 1 << 20)
    if chosen != "hierarchical":
        failures.append(f"rank {ctx.rank}: all-reduce takes {chosen!r}, not the hierarchical one "
                        f"({be.algorithms})")
    for dtype_name in dtype_names:
        cases = [(count, op, mode, None) for count in _counts(ctx.world_size)
                 for op in ops_for(dtype_name) for mode in ("sync", "async")]
        f, d = run_cases(ctx, dtype_name, cases)
        failures += f
        digests.update(d)
    return failures, digests


LAYOUTS = [(4, "2"), (6, "2")]


@pytest.mark.parametrize("world,hosts", LAYOUTS, ids=[f"{h}x{w // int(h)}" for w, h in LAYOUTS])
def test_every_dtype_and_op_against_gloo_and_the_reference(ranks, backend, world, hosts):
    if backend != "ringreduce":
        pytest.skip("ringreduce's algorithms")
    names = DTYPE_NAMES if world == 4 else ["float32", "bfloat16", "int64", "complex64"]
    pool = ranks(world, env={"RINGREDUCE_FAKE_HOSTS": hosts})
    harness.check_results(pool.run(_rank_every_dtype, names, timeout=900))


def _rank_choice(ctx):
    import torch
    import torch.distributed as dist

    be = _backend(ctx.group)
    out = {"auto": [be.algorithm("allreduce", n) for n in (0, 1024, 1 << 20, 64 << 20)],
           "broadcast": be.algorithm("broadcast", 1024), "table": be.algorithms}
    # Forced to the flat ring and back: both give the float64 reference's sum.
    x = torch.randn(100_003, generator=torch.Generator().manual_seed(ctx.rank), dtype=torch.float64)
    want = sum(torch.randn(100_003, generator=torch.Generator().manual_seed(r), dtype=torch.float64)
               for r in range(ctx.world_size))
    for algo in ("ring", "auto"):
        be.set_algorithm(algo)
        out[f"{algo} chosen"] = be.algorithm("allreduce", 1 << 20)
        y = x.clone()
        dist.all_reduce(y, group=ctx.group)
        out[f"{algo} error"] = (y - want).abs().max().item()
    return [], {"choice": json.dumps(out)}


def test_the_choice_follows_the_layout(ranks, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's algorithms")
    for world, env, want in (
        (4, {"RINGREDUCE_FAKE_HOSTS": "2"}, "hierarchical"),
        (4, {"RINGREDUCE_FAKE_HOSTS": "2", "RINGREDUCE_ALGO": "ring"}, "ring"),
        (3, {"RINGREDUCE_FAKE_HOSTS": "2"}, "ring"),  # hosts of 2 and 1 ranks
        (2, {"RINGREDUCE_FAKE_HOSTS": "2"}, "ring"),  # one rank per host
    ):
        results = ranks(world, env=env).run(_rank_choice, timeout=120)
        harness.check_results(results)  # the same choices on every rank
        got = json.loads(results[0][1]["choice"])
        assert got["auto"] == [want] * 4, (env, got)
        assert got["broadcast"] == "ring", (env, got)
        assert got["ring chosen"] == "ring", (env, got)
        assert got["auto error"] < 1e-9 and got["ring error"] < 1e-9, (env, got)
        if want == "hierarchical":
            assert "hierarchical all-reduce (2 hosts x 2 ranks)" in got["table"], got
            assert got["auto chosen"] == "hierarchical", got


WORKER = r'''
import json, os, sys, time
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
        t = torch.ones(int(os.environ["COUNT"]))
        for _ in range(20):
            dist.all_reduce(t)
        res["error"] = "no all-reduce failed"
    else:  # desync: rank 0 forces the flat ring, the others take the hierarchical all-reduce
        if rank == 0:
            dist.group.WORLD._get_backend(torch.device("cpu")).set_algorithm("ring")
        dist.all_reduce(torch.ones(100_000))
        res["error"] = "the mismatched op did not fail"
except Exception as e:
    res["error"] = str(e)
res["t_error"] = time.time()
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
os._exit(0)
'''


def _run(tmp_path, world, case, env):
    port = harness.free_port()
    procs = []
    for rank in range(world):
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), CASE=case, OUT=str(tmp_path), RINGREDUCE_FAKE_HOSTS="2",
                 RINGREDUCE_FLIGHT_DIR=str(tmp_path / "flight"),
                 PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    start = time.time()
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{case}: a rank hung")
    results = {r: json.loads((tmp_path / f"rank{r}.json").read_text())
               for r in range(world) if (tmp_path / f"rank{r}.json").exists()}
    why = json.dumps(results, indent=1) + "".join(f"\n--- rank {r} ---\n{o[-2000:]}" for r, o in enumerate(outputs))
    return results, start, why


PHASES = ["host_reduce_scatter", "cross_allreduce", "host_all_gather"]


@pytest.mark.parametrize("phase", PHASES)
def test_a_rank_killed_in_each_phase_fails_every_survivor(tmp_path, backend, phase):
    if backend != "ringreduce":
        pytest.skip("ringreduce's faults")
    world, victim = 4, 3
    shm_before = {n for n in os.listdir("/dev/shm") if n.startswith("ringreduce-")}
    # The victim dies as it enters `phase` of its third all-reduce of 4 MiB.
    results, start, why = _run(tmp_path, world, "kill",
                               {"RINGREDUCE_FAILPOINT": f"hierarchical.{phase}:{victim}:3",
                                "COUNT": str(1 << 20)})
    assert victim not in results, why  # it died
    for rank in range(world - 1):
        err = results[rank]["error"]
        assert "allreduce #" in err, why
        assert f"rank {victim}" in err or "aborted" in err, why
        assert results[rank]["t_error"] - start < 30, why  # the timeout is 60 s
    # Its death is named (over shared memory "died", over TCP "exited or crashed").
    assert any(f"rank {victim}" in results[r]["error"] and ("died" in results[r]["error"]
               or "exited or crashed" in results[r]["error"]) for r in range(world - 1)), why
    assert not {n for n in os.listdir("/dev/shm") if n.startswith("ringreduce-")} - shm_before


def test_ranks_that_chose_differently_fail_as_a_desync(tmp_path, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's faults")
    world = 4
    results, start, why = _run(tmp_path, world, "desync", {})
    for rank in range(world):
        assert rank in results, why
        err = results[rank]["error"]
        assert "allreduce #1" in err and ("called different collectives" in err or "aborted" in err), why
        assert results[rank]["t_error"] - start < 45, why
    assert any("called different collectives" in results[r]["error"] for r in range(world)), why
    # The headers carry the algorithm that sent them, and the error names it.
    assert any("called different collectives" in results[r]["error"] and "by hierarchical" in results[r]["error"]
               for r in range(world)), why

"""The flight recorder: each group keeps its last ops per rank, dumps them on a failure
or on request, and ``python -m ringreduce.flight`` reads the dumps of all ranks.

Each case makes a group of its own (so sequence numbers start at 0) on the shared pools. The
case of a rank that never arrives, whose dump comes from the group's abort, is in
test_faults.py (its ranks are plain processes).
"""

import io
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import redirect_stdout
from datetime import timedelta

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORLD = 3


def _wait_for(paths, seconds=20.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(os.path.exists(p) for p in paths):
            return True
        # A wait with a deadline on a condition another process brings about.
        threading.Event().wait(0.05)
    return False


def _reader(paths):
    from ringreduce import flight

    out = io.StringIO()
    with redirect_stdout(out):
        rc = flight.main(list(paths))
    return rc, out.getvalue()


def _rank_dump_on_request(ctx, directory):
    import torch
    import torch.distributed as dist

    import ringreduce

    failures = []
    g = dist.new_group(backend="ringreduce")
    be = g._get_backend(torch.device("cpu"))
    gen = ctx.gen("flight")
    import time
    began_us = time.time_ns() // 1000
    # A mix of ops, sync and async, with shapes and dtypes of their own.
    a = torch.randn(10, 20, generator=gen)
    dist.all_reduce(a, group=g)
    b = torch.arange(7, dtype=torch.int64)
    dist.broadcast(b, src=1, group=g)
    parts = [torch.empty(5, dtype=torch.float64) for _ in range(ctx.world_size)]
    dist.all_gather(parts, torch.full((5,), float(ctx.rank), dtype=torch.float64), group=g)
    works = [dist.all_reduce(torch.ones(3, dtype=torch.bfloat16), group=g, async_op=True)
             for _ in range(4)]
    for w in works:
        w.wait()
    # The direct op: a contiguous tensor (run with no Work) and a strided one (through the backend).
    ringreduce.all_reduce_(torch.ones(2, 3, dtype=torch.float16), group=g)
    ringreduce.all_reduce_(torch.ones(4, 2)[:, 0], group=g)
    dist.barrier(group=g)
    path = ringreduce.dump_flight_recorder(g, directory)
    want = os.path.join(directory, f"ringreduce_flight_{be.flight_group}_rank{ctx.rank}.json")
    if path != want:
        failures.append(f"dumped to {path}, expected {want}")
    dumped_us = time.time_ns() // 1000
    d = json.loads(open(path).read())
    ops = d["ops"]
    # Recorded on the steady clock, dumped as wall clock time: within this test's own wall clock
    # readings (1 ms of slack for the two clocks' readings around the dump).
    for o in ops:
        if not (began_us - 1000 <= o["issued_us"] and o["ended_us"] <= dumped_us + 1000):
            failures.append(f"op {o}: its times are not within the test's {began_us}..{dumped_us}")
    expect = [("allreduce", "[10, 20]", "Float"), ("broadcast", "[7]", "Long"),
              ("allgather", "[5] [5] [5]", "Double")] + [("allreduce", "[3]", "BFloat16")] * 4 + \
             [("allreduce", "[2, 3]", "Half"), ("allreduce", "[4]", "Float"), ("barrier", "", "")]
    got = [(o["op"], o["shapes"], o["dtype"]) for o in ops]
    if got != expect:
        failures.append(f"recorded {got}, expected {expect}")
    if [o["seq"] for o in ops] != list(range(len(expect))):
        failures.append(f"sequence numbers {[o['seq'] for o in ops]}")
    for o in ops:
        if o["state"] != "completed" or not (o["issued_us"] <= o["started_us"] <= o["ended_us"]):
            failures.append(f"op {o}: not completed, or its times are out of order")
    if (d["rank"], d["world_size"], d["ops_issued"], d["reason"]) != (ctx.rank, ctx.world_size,
                                                                        len(expect), "requested"):
        failures.append(f"dump header {d}")
    dist.barrier()
    rc, text = (None, "")
    if ctx.rank == 0:
        rc, text = _reader([directory])
        if rc != 0 or f"the ranks agree on ops #0 to #{len(expect) - 1}" not in text:
            failures.append(f"the reader exited with {rc}:\n{text}")
    dist.destroy_process_group(g)
    return failures, {}


def test_dump_on_request_and_the_reader_finds_the_ranks_agree(ranks, standin, tmp_path):
    if standin:
        pytest.skip("the flight recorder is ringreduce's")
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_dump_on_request, str(tmp_path), timeout=90))


def _rank_window(ctx, directory):
    import torch
    import torch.distributed as dist

    import ringreduce

    failures = []
    g = dist.new_group(backend="ringreduce")
    be = g._get_backend(torch.device("cpu"))
    if be.flight_capacity != 8:
        failures.append(f"capacity {be.flight_capacity}, RINGREDUCE_FLIGHT_RECORDER=8")
    for i in range(21):
        dist.all_reduce(torch.ones(i + 1), group=g)
    d = json.loads(open(ringreduce.dump_flight_recorder(g, directory)).read())
    seqs = [o["seq"] for o in d["ops"]]
    if seqs != list(range(13, 21)) or d["ops_issued"] != 21:
        failures.append(f"kept {seqs} of {d['ops_issued']}, expected the last 8 of 21")
    if [o["shapes"] for o in d["ops"]] != [f"[{s + 1}]" for s in range(13, 21)]:
        failures.append(f"shapes {[o['shapes'] for o in d['ops']]}")
    dist.destroy_process_group(g)
    return failures, {}


def test_the_recorder_keeps_the_last_n_ops(ranks, standin, tmp_path):
    if standin:
        pytest.skip("the flight recorder is ringreduce's")
    pool = ranks(2, env={"RINGREDUCE_FLIGHT_RECORDER": "8"})
    harness.check_results(pool.run(_rank_window, str(tmp_path), timeout=90))


def _rank_desync(ctx):
    import torch
    import torch.distributed as dist

    failures = []
    g = dist.new_group(backend="ringreduce", timeout=timedelta(seconds=20))
    be = g._get_backend(torch.device("cpu"))
    dist.all_reduce(torch.ones(4), group=g)
    # Rank 0 and the others disagree on the size of op #1: every rank fails, and dumps.
    n = 1000 if ctx.rank == 0 else 2000
    try:
        dist.all_reduce(torch.ones(n), group=g)
        failures.append("the mismatched all-reduce did not fail")
    except RuntimeError:
        pass
    directory = be.flight_dir
    paths = [os.path.join(directory, f"ringreduce_flight_{be.flight_group}_rank{r}.json")
             for r in range(ctx.world_size)]
    if not _wait_for([paths[ctx.rank]], 5):
        failures.append(f"no dump at {paths[ctx.rank]} after the failure")
    else:
        d = json.loads(open(paths[ctx.rank]).read())
        last = d["ops"][-1]
        if last["state"] != "failed" or "called different collectives" not in last.get("error", ""):
            failures.append(f"the last op recorded is {last}")
        if not d["reason"].startswith("allreduce #1 failed"):
            failures.append(f"dump reason {d['reason']!r}")
    dist.barrier()
    if ctx.rank == 0:
        rc, text = _reader(paths)
        if rc != 1 or "op #1 differs between ranks" not in text or "ranks 0: allreduce [1000] Float" \
                not in text or f"ranks {', '.join(map(str, range(1, ctx.world_size)))}: allreduce " \
                                "[2000] Float" not in text:
            failures.append(f"the reader exited with {rc}:\n{text}")
    dist.destroy_process_group(g)
    return failures, {}


def test_a_desync_dumps_every_rank_and_the_reader_shows_the_difference(ranks, standin):
    if standin:
        pytest.skip("the flight recorder is ringreduce's")
    pool = ranks(WORLD)
    harness.check_results(pool.run(_rank_desync, timeout=90))


def test_the_reader_without_dumps_says_so(tmp_path):
    rc, _ = _reader([str(tmp_path)])
    assert rc == 2


def test_the_default_directory_is_the_extensions(tmp_path, monkeypatch):
    """ringreduce.flight looks where the ranks write: the extension's one definition of the
    default directory (RINGREDUCE_FLIGHT_DIR, else $TMPDIR/ringreduce-flight, else /tmp's)."""
    if harness.standin():
        pytest.skip("the flight recorder is ringreduce's")
    from ringreduce import flight
    monkeypatch.setenv("RINGREDUCE_FLIGHT_DIR", str(tmp_path / "given"))
    assert flight.default_dir() == str(tmp_path / "given")
    monkeypatch.delenv("RINGREDUCE_FLIGHT_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert flight.default_dir() == str(tmp_path / "ringreduce-flight")
    monkeypatch.delenv("TMPDIR")
    assert flight.default_dir() == "/tmp/ringreduce-flight"


@pytest.mark.parametrize("args,rc", [(["--help"], 0), ([], 2)])
def test_the_command_runs_without_a_runpy_warning(tmp_path, args, rc):
    """`python -m ringreduce.flight` as a user types it: `import ringreduce` imports
    ringreduce.flight, so the command must not be that module run a second time as __main__
    (runpy's "found in sys.modules ... prior to execution" RuntimeWarning)."""
    env = dict(os.environ, RINGREDUCE_FLIGHT_DIR=str(tmp_path),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "ringreduce.flight", *args], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == rc, (out.stdout, out.stderr)
    assert "RuntimeWarning" not in out.stderr and "sys.modules" not in out.stderr, out.stderr
    if args:
        assert "usage: python -m ringreduce.flight" in out.stdout, out.stdout
    else:  # no dumps in the default directory, RINGREDUCE_FLIGHT_DIR
        assert f"no dumps in {tmp_path}" in out.stderr, out.stderr

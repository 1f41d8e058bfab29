"""How large ops write what a peer reads next: plainly or with non-temporal stores
(RINGREDUCE_STREAM, csrc/algo/handoff.h).

- Streamed writes everywhere (RINGREDUCE_STREAM=stream, RINGREDUCE_STREAM_BYTES=0), with the ring
  and two-shot all-reduce forced in turn: every op against the float64 reference and gloo, and
  bit-identical on every rank.
- The same inputs through a group that streams and one that writes plainly give the same bits,
  for the all-reduce in every mode and for the other collectives.
- The measured mode (the default) runs ops both ways while it learns, with the same results.
- The INFO line says how the group writes its slots.
"""

import os
import subprocess
import sys

import pytest

import harness
import reference
from test_algorithms import _rank_forced

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

STREAM_ALL = {"RINGREDUCE_STREAM": "stream", "RINGREDUCE_STREAM_BYTES": "0"}
# The ring and the window's two-shot write slots and window buffers that the peers read; one-shot
# too (its own buffer), and the kernels' streamed forms are checked for every dtype and op in
# tests/cpp/test_reduce.cpp. Here: a dtype of each kernel kind.
DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "uint8", "bool", "complex64")
FORCED = [(w, a) for w in (2, 4) for a in ("ring", "twoshot", "oneshot")]


@pytest.mark.parametrize("world,algo", FORCED, ids=[f"world{w}-{a}" for w, a in FORCED])
def test_streamed_writes_every_op(ranks, backend, world, algo):
    if backend != "ringreduce":
        pytest.skip("ringreduce's slot writes")
    harness.check_results(ranks(world, env=STREAM_ALL).run(_rank_forced, algo, DTYPES, timeout=600))


def _group(mode):
    import torch.distributed as dist

    # Rank 0's environment when the group is made is what the group agrees on (Config::agree).
    saved = {k: os.environ.get(k) for k in ("RINGREDUCE_STREAM", "RINGREDUCE_STREAM_BYTES")}
    os.environ.update({"RINGREDUCE_STREAM": mode, "RINGREDUCE_STREAM_BYTES": "0"})
    try:
        return dist.new_group(backend="ringreduce")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _rank_same_bits(ctx):
    import torch
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    groups = {m: _group(m) for m in ("plain", "stream", "auto")}
    be = {m: g._get_backend(torch.device("cpu")) for m, g in groups.items()}
    assert [be[m].stream for m in groups] == ["plain", "stream", "auto"], [be[m].stream for m in groups]
    failures = []
    for dtype_name in ("float32", "bfloat16", "int64", "complex64"):
        for op in ("SUM", "AVG", "MAX"):
            if op not in reference.ops_for(dtype_name) or (dtype_name == "complex64" and op == "MAX"):
                continue
            for count in (1009, 70001, 300007):
                x = reference.make_input(ctx.gen("bits", dtype_name, op, count, rank=r), dtype_name,
                                         count, op, n)
                got = {}
                # auto runs the same op several times: it tries both ways on its first ops.
                for m in ("plain", "stream", "auto", "auto", "auto", "auto"):
                    for algo in ("ring", "twoshot"):
                        be[m].set_algorithm(algo)
                        t = x.clone()
                        dist.all_reduce(t, op=reference.reduce_op(op), group=groups[m])
                        got.setdefault(harness.digest(t), []).append(f"{m}/{algo}")
                if len(got) != 1:
                    failures.append(f"{dtype_name} {op} count={count}: rank {r} got different bits: "
                                    f"{list(got.values())}")
    for m in groups:
        be[m].set_algorithm("ring")
    # The other collectives through the ring, streamed and plain.
    for count in (5, 300007):
        outs = {}
        for m, g in groups.items():
            root_x = torch.randn(count, generator=ctx.gen("bc", count, rank=0))
            t = root_x.clone() if r == 0 else torch.zeros(count)
            dist.broadcast(t, 0, group=g)
            mine = torch.randn(count, generator=ctx.gen("ag", count, rank=r))
            ag = torch.empty(count * n)
            dist.all_gather_into_tensor(ag, mine, group=g)
            rs_in = torch.randn(count * n, generator=ctx.gen("rs", count, rank=r))
            rs = torch.empty(count)
            dist.reduce_scatter_tensor(rs, rs_in, group=g)
            red = rs_in[:count].clone()
            dist.reduce(red, 0, group=g)
            a2a = torch.empty(count * n)
            dist.all_to_all_single(a2a, rs_in, group=g)
            outs[m] = [harness.digest(v) for v in (t, ag, rs, red if r == 0 else torch.zeros(1), a2a)]
            if not torch.equal(t, root_x):
                failures.append(f"{m} broadcast count={count}: wrong on rank {r}")
        if len({tuple(v) for v in outs.values()}) != 1:
            failures.append(f"other collectives count={count}: plain and streamed differ on rank {r}: {outs}")
    for g in groups.values():
        dist.destroy_process_group(g)
    return failures, {}


@pytest.mark.parametrize("world", [2, 3])
def test_streamed_plain_and_measured_give_the_same_bits(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("ringreduce's slot writes")
    harness.check_results(ranks(world).run(_rank_same_bits, timeout=600))


def test_the_info_line_says_how_slots_are_written(tmp_path, backend):
    if backend != "ringreduce":
        pytest.skip("ringreduce's INFO line")
    code = ("import torch.distributed as dist, ringreduce\n"
            f"store = dist.FileStore({str(tmp_path / 'store')!r}, 1)\n"
            "dist.init_process_group('ringreduce', store=store, rank=0, world_size=1)\n")
    for env, want in (({}, "slot writes: plain or streamed, measured, from 4 KiB"),
                      ({"RINGREDUCE_STREAM": "plain"}, "slot writes: plain;"),
                      ({"RINGREDUCE_STREAM": "stream", "RINGREDUCE_STREAM_BYTES": "1M"},
                       "slot writes: streamed from 1 MiB")):
        e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                 RINGREDUCE_DEBUG="INFO", **env)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env=e)
        assert out.returncode == 0, out.stderr
        assert want in out.stderr, (env, out.stderr)

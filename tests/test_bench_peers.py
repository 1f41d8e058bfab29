"""Tests of benchmarks/peers.py: its table end to end with ringreduce and gloo only (the peers,
OpenMPI and DeepSpeed, forced off, so neither is needed), and its arithmetic directly.

The subprocess run uses two sizes, one round and a short timing: it tests the table, the launches
and the JSON records, not the numbers.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "peers.py")

# benchmarks/ is no package: load the script as a module (registered first, as its dataclasses need).
_spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
peers = sys.modules["bench_peers"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)


needs_ringreduce = harness.needs_ringreduce()

# Per backend in BACKENDS order: a time(us) and a busbw(GB/s) column; then one x/rr ratio per peer.
BACKEND_COLUMNS = {b: 3 + 2 * i for i, b in enumerate(peers.BACKENDS)}
RATIO_COLUMNS = {b: 3 + 2 * len(peers.BACKENDS) + i for i, b in enumerate(peers.BACKENDS[1:])}


def parse_tables(stdout, spread=False):
    """{world: rows as token lists} from the benchmark's output: of the main tables, or with
    `spread` of the spread tables that follow them when there is more than one launch."""
    tables, world, in_spread = {}, None, False
    for line in stdout.splitlines():
        m = re.match(r"# world (\d+)( \(|: spread over)", line)
        if m:
            world, in_spread = int(m.group(1)), m.group(2) != " ("
            if in_spread == spread:
                tables[world] = []
        elif line.strip() and not line.startswith("#") and in_spread == spread:
            tables[world].append(line.split())
    return tables


@needs_ringreduce
def test_table_with_ringreduce_and_gloo_only(tmp_path):
    path = tmp_path / "peers.json"
    out = subprocess.run(
        [sys.executable, SCRIPT, "--peers", "none", "-g", "2", "--sizes", "1K", "64K", "--rounds", "1",
         "--seconds", "0.02", "--timeout", "50", "--json", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    assert "# OpenMPI: - (left out by --peers)" in out.stdout
    assert "# DeepSpeed: - (left out by --peers)" in out.stdout
    assert not re.search(r"\b(target|met|issue)\b", out.stdout, re.IGNORECASE), out.stdout

    tables = parse_tables(out.stdout)
    assert list(tables) == [2], out.stdout
    rows = tables[2]
    assert [int(r[0]) for r in rows] == [1024, 65536]
    assert [int(r[1]) for r in rows] == [256, 16384]
    for r in rows:
        assert len(r) == 3 + 2 * len(peers.BACKENDS) + len(peers.BACKENDS) - 1, r
        assert r[2] in ("ring", "oneshot", "twoshot"), r  # ringreduce's algorithm at that size
        for b in ("ringreduce", "gloo"):
            i = BACKEND_COLUMNS[b]
            assert float(r[i]) > 0 and float(r[i + 1]) > 0, (b, r)
        assert float(r[RATIO_COLUMNS["gloo"]]) > 0, r
        for b in ("mpi", "deepspeed"):
            i = BACKEND_COLUMNS[b]
            assert r[i] == r[i + 1] == r[RATIO_COLUMNS[b]] == "-", (b, r)
    assert re.search(r"^# world 2, 1KiB\.\.64KiB: ringreduce time = [\d.e+-]+x gloo's$", out.stdout, re.M), \
        out.stdout

    doc = json.loads(path.read_text())
    records = {(r["backend"], r["bytes"]): r for r in doc["results"]}
    assert len(records) == 2 * len(peers.BACKENDS)
    for b in ("ringreduce", "gloo"):
        for n in (1024, 65536):
            r = records[(b, n)]
            assert r["world"] == 2 and r["time_us"] > 0 and r["busbw_GBps"] > 0 and len(r["rounds_us"]) == 1
    assert records[("ringreduce", 1024)]["algorithm"] == rows[0][2]
    assert records[("mpi", 1024)]["time_us"] is None
    assert records[("deepspeed", 1024)]["unavailable"] == "left out by --peers"


@needs_ringreduce
def test_launches_print_the_spread(tmp_path):
    path = tmp_path / "peers.json"
    out = subprocess.run(
        [sys.executable, SCRIPT, "--peers", "none", "-g", "2", "--sizes", "1K", "4K", "--launches", "2",
         "--seconds", "0.02", "--timeout", "50", "--json", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    assert [int(r[0]) for r in parse_tables(out.stdout)[2]] == [1024, 4096]  # the main table as before
    rows = parse_tables(out.stdout, spread=True)[2]
    assert [(int(r[0]), r[1]) for r in rows] == [(n, b) for n in (1024, 4096) for b in ("ringreduce", "gloo")]
    for r in rows:
        best, median, worst, busbw, ratio = map(float, r[2:])
        assert 0 < best <= median <= worst and busbw > 0 and ratio >= 1, r
    for b in ("ringreduce", "gloo"):
        assert re.search(rf"^# world 2, {b}: spread over 2 launches: 1KiB worst/best = [\d.]+, 4KiB worst/best = "
                         r"[\d.]+$", out.stdout, re.M), out.stdout
    doc = json.loads(path.read_text())
    assert sorted((x["round"], x["backend"]) for x in doc["launches"]) == [(r, b) for r in (0, 1)
                                                                          for b in ("gloo", "ringreduce")]
    for r in doc["results"]:
        if r["backend"] in ("ringreduce", "gloo"):
            assert len(r["rounds_us"]) == 2, r
            assert r["best_us"] == min(r["rounds_us"]) and r["worst_us"] == max(r["rounds_us"]), r


def test_results_spread_is_best_median_worst():
    res = peers.Results()
    res.add(0, "ringreduce", 2, {"rows": [{"bytes": 1024, "time_s": 1e-5, "iters": 1}]})
    assert res.spread("ringreduce", 2, 1024) == (1e-5, 1e-5, 1e-5)
    assert res.spread("gloo", 2, 1024) is None


def test_parse_args_launches_is_rounds(capsys):
    assert peers.parse_args(["--launches", "5"]).rounds == 5
    assert peers.parse_args(["--rounds", "2"]).rounds == 2
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit):
            peers.parse_args(["--launches", bad])
        assert "--launches (--rounds) must be at least 1" in capsys.readouterr().err


def test_parse_args_sizes_and_peers():
    args = peers.parse_args([])
    assert args.nproc == [2, 4] and args.rounds == 3 and args.peers == ["mpi", "deepspeed"]
    assert args.sizes == [1 << 10, 8 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20, 64 << 20]
    assert peers.parse_args(["-b", "1K", "-e", "64M", "-f", "8"]).sizes == [1 << 10, 8 << 10, 64 << 10,
                                                                         512 << 10, 4 << 20, 32 << 20]
    assert peers.parse_args(["--peers", "deepspeed"]).peers == ["deepspeed"]
    assert peers.parse_args(["--peers", "none"]).peers == []
    for bad in (["--peers", "nccl"], ["--sizes", "1K", "-b", "1K"], ["-g", "1"], ["-d", "bfloat16", "--sizes", "1"]):
        with pytest.raises(SystemExit):
            peers.parse_args(bad)


def test_summary_ratios_point_the_right_way():
    # ringreduce takes half OpenMPI's time at 1 KiB and a third of it at 64 KiB; at 1 and 64 MiB
    # OpenMPI takes 2x and 3x ringreduce's time, so ringreduce's busbw is 2-3x OpenMPI's.
    res = peers.Results()
    sizes = [1 << 10, 64 << 10, 1 << 20, 64 << 20]
    res.add(0, "ringreduce", 2, {"rows": [{"bytes": n, "time_s": 1.0, "iters": 1} for n in sizes]})
    res.add(0, "mpi", 2, {"rows": [{"bytes": n, "time_s": t, "iters": 1} for n, t in zip(sizes, (2, 3, 2, 3))]})
    lines = peers.summary(2, sizes, res)
    assert lines == [
        "# world 2, 1KiB..64KiB: ringreduce time = 0.33-0.5x OpenMPI's",
        "# world 2, >=1MiB: ringreduce busbw = 2-3x OpenMPI's",
        "# world 2, 64MiB: ringreduce busbw = 3x OpenMPI's",
    ]
    assert peers.busbw_gbps(1 << 30, 4, 1.0) == pytest.approx((1 << 30) * 1.5 / 1e9)

"""Tests of benchmarks/peers.py and the modules it is made of (peers_*.py beside it): its table end
to end with ringreduce (dist.all_reduce and its direct op) and gloo only (the peers, OpenMPI, Intel
MPI, oneCCL and DeepSpeed, forced off, so none is needed), and its arithmetic directly; the native
peers' plumbing (benchmarks/peers_native.py) without them, and their drivers (benchmarks/peers/)
compiled and run where .venv-intel has them.

The subprocess run uses two sizes, one round and a short timing: it tests the table, the launches
and the JSON records, not the numbers.
"""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time

import pytest

import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "peers.py")

# benchmarks/ is no package: load the script as a module (registered first, as its dataclasses need).
# It puts its own folder on sys.path, where the modules it is made of live.
_spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
peers = sys.modules["bench_peers"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peers)
import peers_cpu  # noqa: E402
import peers_launch  # noqa: E402
import peers_native as native  # noqa: E402
import peers_ranks  # noqa: E402
import peers_report  # noqa: E402


needs_ringreduce = harness.needs_ringreduce()

# Per backend in BACKENDS order: a time(us) and a busbw(GB/s) column; then one x/rr ratio per peer.
BACKEND_COLUMNS = {b: 3 + 2 * i for i, b in enumerate(peers_ranks.BACKENDS)}
RATIO_COLUMNS = {b: 3 + 2 * len(peers_ranks.BACKENDS) + i for i, b in enumerate(peers_ranks.BACKENDS[1:])}


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
        [sys.executable, SCRIPT, "--peers", "cxx", "-g", "2", "--sizes", "1K", "64K", "--rounds", "1",
         "--seconds", "0.02", "--timeout", "50", "--json", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    for label in ("OpenMPI", "IntelMPI", "oneCCL", "DeepSpeed"):
        assert f"# {label}: - (left out by --peers)" in out.stdout
    assert "# rr-c++: the same direct op in a launch of its own, its timed calls looped in C++" in out.stdout
    assert not re.search(r"\b(target|met|issue)\b", out.stdout, re.IGNORECASE), out.stdout

    tables = parse_tables(out.stdout)
    assert list(tables) == [2], out.stdout
    rows = tables[2]
    assert [int(r[0]) for r in rows] == [1024, 65536]
    assert [int(r[1]) for r in rows] == [256, 16384]
    for r in rows:
        assert len(r) == 3 + 2 * len(peers_ranks.BACKENDS) + len(peers_ranks.BACKENDS) - 1, r
        assert r[2] in ("ring", "oneshot", "twoshot"), r  # ringreduce's algorithm at that size
        for b in ("ringreduce", "direct", "cxx", "gloo"):
            i = BACKEND_COLUMNS[b]
            assert float(r[i]) > 0 and float(r[i + 1]) > 0, (b, r)
        for b in ("direct", "cxx", "gloo"):
            assert float(r[RATIO_COLUMNS[b]]) > 0, (b, r)
        for b in peers_launch.PEERS:
            i = BACKEND_COLUMNS[b]
            assert r[i] == r[i + 1] == r[RATIO_COLUMNS[b]] == "-", (b, r)
    assert re.search(r"^# world 2, 1KiB\.\.64KiB: ringreduce time = [\d.e+-]+x rr-direct's, [\d.e+-]+x rr-c\+\+'s, "
                     r"[\d.e+-]+x gloo's$",
                     out.stdout, re.M), out.stdout

    doc = json.loads(path.read_text())
    records = {(r["backend"], r["bytes"]): r for r in doc["results"]}
    assert len(records) == 2 * len(peers_ranks.BACKENDS)
    for b in ("ringreduce", "direct", "cxx", "gloo"):
        for n in (1024, 65536):
            r = records[(b, n)]
            assert r["world"] == 2 and r["time_us"] > 0 and r["busbw_GBps"] > 0 and len(r["rounds_us"]) == 1
    assert records[("ringreduce", 1024)]["algorithm"] == rows[0][2]
    assert records[("mpi", 1024)]["time_us"] is None
    assert records[("deepspeed", 1024)]["unavailable"] == "left out by --peers"
    assert records[("direct", 1024)]["algorithm"] is None


@needs_ringreduce
def test_launches_print_the_spread(tmp_path):
    path = tmp_path / "peers.json"
    out = subprocess.run(
        [sys.executable, SCRIPT, "--peers", "none", "-g", "2", "--sizes", "1K", "4K", "--launches", "2",
         "--seconds", "0.02", "--timeout", "50", "--json", str(path)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    assert [int(r[0]) for r in parse_tables(out.stdout)[2]] == [1024, 4096]  # the main table as before
    rows = parse_tables(out.stdout, spread=True)[2]
    assert [(int(r[0]), r[1]) for r in rows] == [(n, b) for n in (1024, 4096)
                                                 for b in ("ringreduce", "rr-direct", "gloo")]
    for r in rows:
        best, median, worst, busbw, ratio = map(float, r[2:7])
        assert 0 < best <= median <= worst and busbw > 0 and ratio >= 1, r
        # The medians over the CPU-normal and the CPU-slow launches: "-" where none was of that kind.
        slow, probed = map(int, r[9].split("/"))
        assert probed == 2 and 0 <= slow <= 2, r
        assert (r[7] == "-") == (slow == 2) and (slow == 2 or best <= float(r[7]) <= worst), r
        assert (r[8] == "-") == (slow == 0) and (slow == 0 or best <= float(r[8]) <= worst), r
    # The launch with the best probe, whichever backend's, is never CPU slow.
    assert min(int(r[9].split("/")[0]) for r in rows) < 2, rows
    spread_lines = out.stdout[out.stdout.index("# world 2: spread over"):].splitlines()
    assert all(len(x) <= 120 for x in spread_lines), spread_lines
    m = re.search(r"^# world 2: CPU probe \(ns per loop iteration; see the header\) over its 6 launches: "
                  r"best ([\d.]+), median ([\d.]+),\n# worst ([\d.]+) \(worst/best [\d.]+\); CPU slow = probe > "
                  r"1.3x the best: (\d+) of 6 launches$", out.stdout, re.M)
    assert m, out.stdout
    assert 0 < float(m.group(1)) <= float(m.group(2)) <= float(m.group(3)), m.group(0)
    said = " ".join(x[2:] for x in out.stdout.splitlines() if x.startswith("# "))
    assert ("the launch's probe the slower of the two. Taken in the ranks (after a barrier) for ringreduce, "
            "rr-direct, rr-c++, gloo, OpenMPI (mpi4py) and DeepSpeed; for Intel MPI and oneCCL (C programs) in min(world, "
            "cores) processes forked by peers.py") in said, out.stdout
    for b in ("ringreduce", "rr-direct", "gloo"):
        assert re.search(rf"^# world 2, {b}: spread over 2 launches: 1KiB worst/best = [\d.]+, 4KiB worst/best = "
                         r"[\d.]+$", out.stdout, re.M), out.stdout
    doc = json.loads(path.read_text())
    assert sorted((x["round"], x["backend"]) for x in doc["launches"]) == [
        (r, b) for r in (0, 1) for b in ("direct", "gloo", "ringreduce")]
    probe = doc["cpu_probe"]["2"]
    assert probe["launches"] == 6 and probe["slow_launches"] == int(m.group(4)), probe
    assert probe["best"] <= probe["median"] <= probe["worst"] and probe["slow_above"] == 1.3 * probe["best"], probe
    for x in doc["launches"]:
        assert x["cpu_probe_by"] == "ranks" and isinstance(x["cpu_slow"], bool), x
        assert x["cpu_probe_ns"] == max(x["cpu_probe_before_ns"], x["cpu_probe_after_ns"]) > 0, x
        assert x["cpu_slow"] == (x["cpu_probe_ns"] > probe["slow_above"]), x
    for r in doc["results"]:
        if r["backend"] in ("ringreduce", "direct", "gloo"):
            assert len(r["rounds_us"]) == 2, r
            assert r["best_us"] == min(r["rounds_us"]) and r["worst_us"] == max(r["rounds_us"]), r
            assert 0 <= r["cpu_slow_launches"] <= 2, r
            assert (r["cpu_normal_median_us"] is None) == (r["cpu_slow_launches"] == 2), r
            assert (r["cpu_slow_median_us"] is None) == (r["cpu_slow_launches"] == 0), r


def test_results_spread_is_best_median_worst():
    res = peers_report.Results()
    res.add(0, "ringreduce", 2, {"rows": [{"bytes": 1024, "time_s": 1e-5, "iters": 1}]})
    assert res.spread("ringreduce", 2, 1024) == (1e-5, 1e-5, 1e-5)
    assert res.spread("gloo", 2, 1024) is None


def _launch(rnd, backend, time_s, probe_ns):
    return rnd, backend, 2, {"rows": [{"bytes": 1024, "time_s": time_s, "iters": 1}], "cpu_probe_ns": probe_ns}


def test_spread_splits_launches_by_the_cpu_probe():
    # Probes of 20, 21 and 30 ns: slow above 1.3 x 20 = 26, so the third round's launches are CPU
    # slow. ringreduce's times follow the CPU; gloo has no slow launch of the CPU but one of its own.
    res = peers_report.Results()
    for rnd, probe, rr, gloo in ((0, 20.0, 5e-6, 9e-6), (1, 21.0, 6e-6, 30e-6), (2, 30.0, 9e-6, 10e-6)):
        res.add(*_launch(rnd, "ringreduce", rr, probe))
        res.add(*_launch(rnd, "gloo", gloo, probe + 1 if rnd < 2 else 20.5))
    assert res.slow_cpu_limit(2) == pytest.approx(26.0) and res.slow_cpu_limit(4) is None
    assert res.split("ringreduce", 2, 1024) == pytest.approx((5.5e-6, 9e-6, 1, 3))
    assert res.split("gloo", 2, 1024) == (10e-6, None, 0, 3)
    lines = peers_report.spread(2, peers.parse_args(["-g", "2", "--sizes", "1K", "--launches", "3"]), res)
    assert all(len(x) <= 120 for x in lines), lines
    assert "# world 2: CPU probe (ns per loop iteration; see the header) over its 6 launches: best 20.0, median 21.0," \
        in lines
    assert "# worst 30.0 (worst/best 1.50); CPU slow = probe > 1.3x the best: 1 of 6 launches" in lines
    columns = next(x for x in lines if x.startswith("#      size(B)")).split()[1:]
    assert columns[-3:] == ["cpu-ok(us)", "cpu-slow(us)", "slow/all"], columns
    rows = {x.split()[1]: x.split()[7:] for x in lines if not x.startswith("#")}
    assert rows == {"ringreduce": ["5.5", "9.0", "1/3"], "gloo": ["10.0", "-", "0/3"]}, lines


def test_cpu_probe_in_processes_at_once():
    assert peers_cpu.cpu_probe() > 0
    assert peers_cpu.cpu_probe_processes(2) > 0


def test_parse_args_launches_is_rounds(capsys):
    assert peers.parse_args(["--launches", "5"]).rounds == 5
    assert peers.parse_args(["--rounds", "2"]).rounds == 2
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit):
            peers.parse_args(["--launches", bad])
        assert "--launches (--rounds) must be at least 1" in capsys.readouterr().err


def test_parse_args_sizes_and_peers():
    args = peers.parse_args([])
    assert args.nproc == [2, 4] and args.rounds == 3 and args.peers == ["cxx", "mpi", "impi", "ccl", "deepspeed"]
    assert args.sizes == [1 << 10, 8 << 10, 64 << 10, 512 << 10, 1 << 20, 4 << 20, 64 << 20]
    assert peers.parse_args(["-b", "1K", "-e", "64M", "-f", "8"]).sizes == [1 << 10, 8 << 10, 64 << 10,
                                                                         512 << 10, 4 << 20, 32 << 20]
    assert peers.parse_args(["--peers", "deepspeed"]).peers == ["deepspeed"]
    assert peers.parse_args(["--peers", "ccl,impi"]).peers == ["impi", "ccl"]
    assert peers.parse_args(["--peers", "none"]).peers == []
    assert peers.parse_args(["--peers", "impi,cxx"]).peers == ["cxx", "impi"]
    for bad in (["--peers", "nccl"], ["--sizes", "1K", "-b", "1K"], ["-g", "1"], ["-d", "bfloat16", "--sizes", "1"]):
        with pytest.raises(SystemExit):
            peers.parse_args(bad)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_timed_count_fills_the_seconds_when_single_calls_are_slower_than_the_loop():
    """A backend whose calls made one at a time take 20x its looped ones (ranks out of step, a call
    from Python timed alone): the timed loop still lasts about --seconds. A count taken from single
    warm-up calls gave it a twentieth of that."""
    per_loop_op, per_call, seconds = 20e-6, 400e-6, 0.1
    comm = peers_ranks.Comm(rank=0, world=1, zeros=lambda n: [0.0] * n,
                            allreduce=lambda buf: _spin(per_call), barrier=lambda: None, allmax=lambda x: x,
                            loop=lambda buf, n: _spin(n * per_loop_op))
    iters = peers_ranks.calibrate(comm, None, seconds)
    assert 0.5 * seconds <= iters * per_loop_op <= 2 * seconds, iters
    # Without a loop of its own, the Python loop of single calls is what is timed and calibrated.
    comm.loop = None
    iters = peers_ranks.calibrate(comm, None, seconds)
    assert 0.5 * seconds <= iters * per_call <= 2 * seconds, iters


def test_calibration_agrees_across_ranks_through_allmax():
    """The count is taken from the slowest rank's batch time (what allmax returns), so every rank
    runs the same batches and gets the same count."""
    times = iter([1e-3, 4e-3, 0.05])  # the slowest rank's time of each batch
    batches = []
    comm = peers_ranks.Comm(rank=0, world=2, zeros=lambda n: None, allreduce=lambda buf: None,
                            barrier=lambda: None, allmax=lambda x: next(times),
                            loop=lambda buf, n: batches.append(n))
    iters = peers_ranks.calibrate(comm, None, 0.2)
    # Each batch sized toward a tenth of 0.2 s from the last one's time (1 ms for 1: about 24), and
    # the count from the one that reached it (50 ms).
    assert len(batches) == 3 and batches[0] == 1 and 20 <= batches[1] <= 30 and 5 * batches[1] <= batches[2]
    assert iters == math.ceil(0.2 * batches[2] / 0.05)


def test_the_ranks_modules_need_no_ringreduce():
    # The ranks and the peers' probe run peers_ranks.py in .venv-peers, which has no ringreduce, and
    # tp_decode.py's DeepSpeed ranks import peers_launch there; only the report and the command line
    # may import it (for ringreduce.bench's sizes), and torch loads only in a worker that uses it.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import peers_launch, peers_ranks; "
            "print(sorted(m for m in ('ringreduce', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, os.path.dirname(SCRIPT)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
    usage = subprocess.run([sys.executable, os.path.join(os.path.dirname(SCRIPT), "peers_ranks.py")],
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 1 and "worker BACKEND" in usage.stderr, usage.stderr


def test_parse_args_takes_ringreduce_bench_sizes(capsys):
    assert peers.parse_args(["--sizes", "4KiB", "1M"]).sizes == [4096, 1 << 20]
    with pytest.raises(SystemExit):
        peers.parse_args(["--sizes", "1.5K"])
    assert "cannot parse size '1.5K'" in capsys.readouterr().err


def test_summary_ratios_point_the_right_way():
    # ringreduce takes half OpenMPI's time at 1 KiB and a third of it at 64 KiB; at 1 and 64 MiB
    # OpenMPI takes 2x and 3x ringreduce's time, so ringreduce's busbw is 2-3x OpenMPI's.
    res = peers_report.Results()
    sizes = [1 << 10, 64 << 10, 1 << 20, 64 << 20]
    res.add(0, "ringreduce", 2, {"rows": [{"bytes": n, "time_s": 1.0, "iters": 1} for n in sizes]})
    res.add(0, "mpi", 2, {"rows": [{"bytes": n, "time_s": t, "iters": 1} for n, t in zip(sizes, (2, 3, 2, 3))]})
    lines = peers_report.summary(2, sizes, res)
    assert lines == [
        "# world 2, 1KiB..64KiB: ringreduce time = 0.33-0.5x OpenMPI's",
        "# world 2, >=1MiB: ringreduce busbw = 2-3x OpenMPI's",
        "# world 2, 64MiB: ringreduce busbw = 3x OpenMPI's",
    ]
    assert peers_report.busbw_gbps(1 << 30, 4, 1.0) == pytest.approx((1 << 30) * 1.5 / 1e9)


# ---------------------------------------------------------------------------------------------------
# Intel MPI and oneCCL (benchmarks/peers_native.py and the drivers in benchmarks/peers/)

# What a driver's rank 0 writes (benchmarks/peers/timing.h, peers_write_json), byte for byte in form.
DRIVER_JSON = ('{"rows": [{"bytes": 1024, "time_s": 2.500000000e-06, "iters": 80000}, '
               '{"bytes": 65536, "time_s": 1.000000000e-05, "iters": 20000}], '
               '"library": "Intel(R) MPI Library 2021.18.1 for Linux* OS"}\n')


def _args(sizes):
    args = peers.parse_args(["-g", "2", "--sizes", *sizes, "--launches", "1"])
    args.started = "2026-01-01T00:00:00"  # as main() sets it, for the header
    return args


def test_driver_json_fills_the_native_columns():
    args = _args(["1K", "64K"])
    res = peers_report.Results()
    res.add(0, "ringreduce", 2, {"rows": [{"bytes": 1024, "time_s": 5e-6, "iters": 1},
                                          {"bytes": 65536, "time_s": 2e-5, "iters": 1}]})
    res.add(0, "impi", 2, json.loads(DRIVER_JSON))
    res.add(0, "ccl", 2, json.loads(DRIVER_JSON.replace("Intel(R) MPI Library 2021.18.1 for Linux* OS", "oneCCL")))
    table_peers = {b: peers_launch.Peer(b, "python") for b in peers_ranks.BACKENDS}
    lines = peers_report.table(2, args, table_peers, res)
    assert all(peers_launch.LABELS[b] in lines[1].split() for b in peers_ranks.BACKENDS), lines[1]
    assert all(f"{peers_launch.LABELS[b]}/rr" in lines[2].split() for b in peers_ranks.BACKENDS[1:]), lines[2]
    rows = [x.split() for x in lines[3:5]]
    for r, (rr, t) in zip(rows, ((5.0, 2.5), (20.0, 10.0)), strict=True):
        for b in ("impi", "ccl"):
            assert float(r[BACKEND_COLUMNS[b]]) == t and float(r[RATIO_COLUMNS[b]]) == t / rr, (b, r)
        assert float(r[BACKEND_COLUMNS["ringreduce"]]) == rr
        assert r[BACKEND_COLUMNS["mpi"]] == "n/a"  # installed here, but nothing ran
    assert "# world 2, 1KiB..64KiB: ringreduce time = 2x IntelMPI's, 2x oneCCL's" in lines


def test_missing_native_peer_is_a_dash_with_the_reason(tmp_path):
    args = _args(["1K"])
    found = {name: peers_launch.probe_peer(name, "python", "float32", 10, intel_root=str(tmp_path))
             for name in native.NATIVE}
    for name, peer in found.items():
        assert peer.missing.startswith("not installed: no ") and "`make bench-peers` sets up" in peer.missing, peer
        assert not peer.runs
    every = {b: peers_launch.Peer(b, "python", missing="left out by --peers") for b in peers_launch.PEERS}
    every |= {b: peers_launch.Peer(b, "python") for b in peers_launch.ESSENTIAL + ("direct", "cxx")} | found
    head = peers_report.header(args, every)
    for name in native.NATIVE:
        assert f"# {peers_launch.LABELS[name]}: - ({found[name].missing})" in head
    res = peers_report.Results()
    res.add(0, "ringreduce", 2, {"rows": [{"bytes": 1024, "time_s": 5e-6, "iters": 1}]})
    row = peers_report.table(2, args, every, res)[3].split()
    for name in native.NATIVE:
        assert row[BACKEND_COLUMNS[name]] == row[BACKEND_COLUMNS[name] + 1] == row[RATIO_COLUMNS[name]] == "-", row


def test_oneccl_without_libccl_so_2_says_so(tmp_path):
    for path in ("bin/mpiexec", "bin/mpicxx", "lib/libmpi.so.12", "include/oneapi/ccl.hpp", "lib/libccl.so.1"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    why = native.missing("ccl", str(tmp_path))
    assert "libccl.so.2" in why and "oneccl wheel" in why, why
    assert native.missing("impi", str(tmp_path)).endswith("bin/mpicc; `make bench-peers` sets up " + str(tmp_path))


def test_native_launch_names_intel_mpi_by_absolute_path(tmp_path):
    root = str(tmp_path)
    base = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/x", "I_MPI_PIN": "1", "CCL_ALLREDUCE": "ring", "HOME": "/h"}
    env = native.environment("ccl", root, base)
    assert env["PATH"] == f"{root}/bin:/usr/bin" and env["LD_LIBRARY_PATH"] == f"{root}/lib:/opt/x"
    assert env["I_MPI_ROOT"] == env["CCL_ROOT"] == root and env["FI_PROVIDER_PATH"] == f"{root}/lib"
    assert env["I_MPI_FABRICS"] == "shm" and env["I_MPI_PIN"] == "1"  # the caller's own setting wins
    assert env["CCL_WORKER_OFFLOAD"] == "0" and env["CCL_ALLREDUCE"] == "ring" and env["HOME"] == "/h"
    assert "CCL_ROOT" not in native.environment("impi", root, base)
    assert native.from_caller(base) == {"CCL_ALLREDUCE": "ring", "I_MPI_PIN": "1"}
    cmd = native.command(root, "/b/impi_allreduce", 4, ["--version"])
    assert cmd == [f"{root}/bin/mpiexec", "-n", "4", "/b/impi_allreduce", "--version"]
    for name in native.NATIVE:
        compiler = native.compile_command(name, root, "/b/out")[0]
        assert compiler == f"{root}/bin/" + ("mpicc" if name == "impi" else "mpicxx")


@pytest.mark.parametrize("name", native.NATIVE)
def test_driver_builds_runs_and_checks_its_sums(name, tmp_path):
    """The driver compiled from benchmarks/peers/ and run at world 2 under .venv-intel's mpiexec, as
    `make bench-peers` runs it: its JSON has a positive time and an iteration count per size."""
    why = native.missing(name, native.DEFAULT_ROOT)
    if why:
        pytest.skip(f"{peers_launch.LABELS[name]} is not set up here ({why})")
    info = native.probe(name, native.DEFAULT_ROOT, timeout=60, build_dir=str(tmp_path / "build"))
    assert info["version"] and info["package"] != "unknown", info
    out = tmp_path / "out.json"
    cmd = native.command(native.DEFAULT_ROOT, info["binary"], 2, [
        "--sizes", "1024,65536", "--seconds", "0.01", "--warmup", str(peers_ranks.WARMUP),
        "--calibrate", str(peers_ranks.CALIBRATE_SHARE), "--min-iters", str(peers_ranks.MIN_ITERS), "--out", str(out)])
    env = native.environment(name, native.DEFAULT_ROOT, dict(os.environ))
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert [r["bytes"] for r in result["rows"]] == [1024, 65536]
    assert all(r["time_s"] > 0 and r["iters"] >= peers_ranks.MIN_ITERS for r in result["rows"]), result
    assert result["library"], result
    # A driver asked for what it cannot do says so, and does not run.
    bad = subprocess.run([info["binary"], "--sizes", "1023", "--seconds", "1", "--warmup", "1", "--calibrate", "0.1",
                          "--min-iters", "1",
                          "--out", str(out)], env=env, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "whole number of floats" in bad.stderr, bad.stderr

"""Tests of benchmarks/call_path.py, the cost of a small all-reduce along each path a program calls it
by: it runs at toy counts at world 1 and 2 with every path (the compiled ones under aot_eager,
which compiles in seconds), prints a row per path and the closing line per world, and writes every
round to --json, the paths on torch's fake process group beside; with --compile-backend none it
leaves the compiled paths out. The figures
themselves are not tested (the machines are shared).
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
SCRIPT = os.path.join(REPO, "benchmarks", "call_path.py")

_spec = importlib.util.spec_from_file_location("bench_call_path", SCRIPT)
cp = sys.modules["bench_call_path"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cp)

TOY = ["--calls", "30", "--rounds", "2", "--warmup", "12", "--timeout", "120"]
CLOSING = re.compile(r"^# call path, world (\d+): async = ([\d.]+)x sync, functional = ([\d.]+)x sync"
                     r"(, compiled - mul = (-?[\d.]+)x sync)?; sync ([\d.]+) us, direct op ([\d.]+) us$", re.M)

needs_ringreduce = harness.needs_ringreduce()


def _run(args, tmp_path):
    path = tmp_path / "cp.json"
    out = subprocess.run([sys.executable, SCRIPT, *args, "--json", str(path)], cwd=REPO, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    return out.stdout, json.loads(path.read_text())


@needs_ringreduce
def test_every_path_at_world_1_and_2(tmp_path):
    stdout, data = _run(["-g", "1", "2", "--compile-backend", "aot_eager", *TOY], tmp_path)
    assert sorted(data["worlds"]) == ["1", "2"]
    for world in ("1", "2"):
        times = data["worlds"][world]["times"]
        assert list(times) == list(cp.PATHS) + [f"fake:{p}" for p in cp.ON_FAKE], times
        assert all(len(v) == 2 and all(x > 0 for x in v) for v in times.values()), times
    closings = CLOSING.findall(stdout)
    assert [c[0] for c in closings] == ["1", "2"], stdout
    assert all(c[3] for c in closings), stdout  # the compiled difference is printed
    rows = [line.split()[0] for line in stdout.splitlines() if line.startswith("   ")]
    assert rows == (list(cp.PATHS) + ["compiled"]) * 2, rows  # "compiled - mul" splits on its spaces


@needs_ringreduce
def test_compile_backend_none_leaves_the_compiled_paths_out(tmp_path):
    stdout, data = _run(["-g", "2", "--compile-backend", "none", *TOY], tmp_path)
    times = data["worlds"]["2"]["times"]
    eager = [p for p in cp.PATHS if p not in cp.COMPILED]
    assert list(times) == eager + [f"fake:{p}" for p in cp.ON_FAKE if p in eager], times
    m = CLOSING.search(stdout)
    assert m and m.group(1) == "2" and m.group(4) is None, stdout


def test_parse_args():
    args = cp.parse_args([])
    assert (args.nproc, args.bytes, args.compile_backend) == ([1, 2, 4], 1024, "inductor")
    assert cp.parse_args(["--bytes", "8K"]).bytes == 8192
    with pytest.raises(SystemExit):
        cp.parse_args(["--bytes", "6"])
    with pytest.raises(SystemExit):
        cp.parse_args(["-g", "0"])

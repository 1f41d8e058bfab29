"""Tests of benchmarks/call_path.py, the cost of a small all-reduce along each path a program calls it
by: it runs at toy counts at world 2 with every path (the compiled ones under aot_eager, which
compiles in seconds), prints a row per path and the closing line, and writes every round to
--json, the paths on torch's fake process group beside; without compiled paths (--compile-backend
none) the report leaves them out. The figures
themselves are not tested (the machines are shared). The C++ loops of the backends'
allreduce (sync-c++, async-c++) run on ringreduce's group and on the fake one.
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
                     r"(, compiled - mul = (-?[\d.]+)x sync)?; sync ([\d.]+) us, direct op ([\d.]+) us"
                     r"(; in C\+\+, ringreduce's backend adds (-?[\d.]+) us sync, (-?[\d.]+) async to the fake "
                     r"group's)?$", re.M)

needs_ringreduce = harness.needs_ringreduce()


def _run(args, tmp_path):
    path = tmp_path / "cp.json"
    out = subprocess.run([sys.executable, SCRIPT, *args, "--json", str(path)], cwd=REPO, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    return out.stdout, json.loads(path.read_text())


@needs_ringreduce
def test_every_path_at_world_2(tmp_path):
    stdout, data = _run(["-g", "2", "--compile-backend", "aot_eager", *TOY], tmp_path)
    assert sorted(data["worlds"]) == ["2"]
    times = data["worlds"]["2"]["times"]
    assert list(times) == list(cp.PATHS) + [f"fake:{p}" for p in cp.ON_FAKE], times
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in times.values()), times
    closings = CLOSING.findall(stdout)
    # With the compiled difference, and what ringreduce's backend adds in C++.
    assert [c[0] for c in closings] == ["2"] and closings[0][3] and closings[0][7], stdout
    rows = [line.split()[0] for line in stdout.splitlines() if line.startswith("   ")]
    assert rows == list(cp.PATHS) + ["compiled"], rows  # "compiled - mul" splits on its spaces
    assert re.search(r"^# world 2 \(CPU probe [\d.]+ ns before, [\d.]+ after\)$", stdout, re.M), stdout


def test_report_without_the_compiled_paths():
    """--compile-backend none: no compiled rows, and the closing line says nothing of them."""
    times = {k: [1e-5, 2e-5] for k in cp.PATHS if k not in cp.COMPILED}
    times.update({f"fake:{k}": [5e-6] for k in cp.ON_FAKE if k not in cp.COMPILED})
    lines = cp.report(2, {"times": times, "warmup_s": {k: 0.0 for k in times}})
    m = CLOSING.search("\n".join(lines))
    assert m and m.group(1) == "2" and m.group(4) is None, lines
    assert not any(line.split()[0].startswith("compiled") for line in lines if line.startswith("   ")), lines
    # The fake group's cost and what ringreduce adds, where the path ran on both.
    sync = next(line for line in lines if line.startswith("   sync"))
    assert sync.split()[4:6] == ["5.00", "10.00"], sync


def test_parse_args():
    args = cp.parse_args([])
    assert (args.nproc, args.bytes, args.compile_backend) == ([1, 2, 4], 1024, "inductor")
    assert cp.parse_args(["--bytes", "8K"]).bytes == 8192
    with pytest.raises(SystemExit):
        cp.parse_args(["--bytes", "6"])
    with pytest.raises(SystemExit):
        cp.parse_args(["-g", "0"])

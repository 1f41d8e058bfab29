"""RINGREDUCE_DEBUG: silent by default; at INFO one set-up line per rank per group (and WARN lines
for failed ops); at TRACE one per op; RINGREDUCE_DEBUG_FILE with %h and %p. And
`python -m ringreduce.info`."""

import os
import socket
import subprocess
import sys

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKER = r'''
import os, torch, torch.distributed as dist
from datetime import timedelta
import ringreduce  # noqa: F401
dist.init_process_group("ringreduce", timeout=timedelta(seconds=20))
t = torch.ones(1000)
dist.all_reduce(t)
g = dist.new_group(timeout=timedelta(seconds=20))
try:  # a desync on the second group: a WARN line on each rank
    dist.all_reduce(torch.ones(10 if dist.get_rank() == 0 else 20), group=g)
except RuntimeError:
    pass
dist.barrier()
dist.destroy_process_group()
'''


def _run(tmp_path, env):
    if os.environ.get("RINGREDUCE_TEST_BACKEND", "ringreduce") != "ringreduce":
        pytest.skip("ringreduce's own log lines")
    port = harness.free_port()
    procs = []
    for rank in range(2):
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), RINGREDUCE_FLIGHT_DIR=str(tmp_path / "flight"),
                 PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
        for knob in ("RINGREDUCE_DEBUG", "RINGREDUCE_DEBUG_FILE"):
            if knob not in env:
                e.pop(knob, None)
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return outs


def test_silent_by_default(tmp_path):
    for out in _run(tmp_path, {}):
        assert "RINGREDUCE INFO" not in out and "RINGREDUCE WARN" not in out, out


def test_info_lines_per_rank_and_group_and_warn_lines(tmp_path):
    outs = _run(tmp_path, {"RINGREDUCE_DEBUG": "INFO"})
    for rank, out in enumerate(outs):
        info = [x for x in out.splitlines() if f"[{rank}] RINGREDUCE INFO" in x]
        assert len(info) == 2, out  # the default group and the new one
        for line in info:
            assert line.startswith(f"{socket.gethostname()}:"), line
            for part in (f"rank {rank} of 2", "torch ", "simd ", "peers over shm: ", "algorithms: ",
                         "slice_bytes=", "slots="):
                assert part in line, (part, line)
        warn = [x for x in out.splitlines() if f"[{rank}] RINGREDUCE WARN" in x]
        assert len(warn) == 1 and "allreduce #0 failed" in warn[0], out
        assert "RINGREDUCE TRACE" not in out, out


def test_trace_lines_per_op_into_a_file_per_rank(tmp_path):
    pattern = str(tmp_path / "rr-%h-%p.log")
    outs = _run(tmp_path, {"RINGREDUCE_DEBUG": "TRACE", "RINGREDUCE_DEBUG_FILE": pattern})
    assert all("RINGREDUCE" not in out for out in outs), outs
    logs = sorted(p for p in os.listdir(tmp_path) if p.startswith(f"rr-{socket.gethostname()}-"))
    assert len(logs) == 2, logs
    for name in logs:
        text = (tmp_path / name).read_text()
        assert text.count("RINGREDUCE INFO") == 2, text
        assert "allreduce #0 [1000] Float: done in" in text, text
        assert "barrier #1: done in" in text, text


def test_info_command_prints_the_build_and_the_machine():
    out = subprocess.run([sys.executable, "-m", "ringreduce.info"], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep
                                               + os.environ.get("PYTHONPATH", "")))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for part in ("ringreduce ", "torch ", "extension: ", "CPU loops: ", "transport shm: ",
                 "/dev/shm", "MiB free", "transport tcp: usable", "backend registered"):
        assert part in text, (part, text)

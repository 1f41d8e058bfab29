"""benchmarks/spin_ab.py at toy counts: two ringreduce groups made with different
RINGREDUCE_SPIN_MAX_US in the same processes really carry them, and the run prints a line per work
time with a cell per group. The figures are not tested (the machines are shared)."""

import os
import re
import subprocess
import sys

import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "spin_ab.py")


@harness.needs_ringreduce()
def test_spin_ab_runs_each_group_with_its_setting():
    out = subprocess.run([sys.executable, SCRIPT, "--spin-max", "1000", "50", "--work", "20", "100", "--calls", "40",
                          "--rounds", "2", "--warmup", "5", "--timeout", "100"], cwd=REPO, capture_output=True,
                         text=True, timeout=150)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"
    lines = [line for line in out.stdout.splitlines() if line.startswith("work ")]
    assert [line.split()[1] for line in lines] == ["20", "100"], out.stdout
    for line in lines:
        assert re.fullmatch(r"work \d+ us: spin_max 1000 us: -?[\d.]+; spin_max 50 us: -?[\d.]+", line), line


def _rank_spin_max(ctx):
    import torch
    import torch.distributed as dist

    got = []
    for value in ("1000", "50"):
        os.environ["RINGREDUCE_SPIN_MAX_US"] = value
        got.append(dist.new_group(backend="ringreduce")._get_backend(torch.device("cpu")).spin_max_us)
    os.environ.pop("RINGREDUCE_SPIN_MAX_US")
    return ([] if got == [1000, 50] else [f"rank {ctx.rank}: groups made with 1000 and 50 have {got}"]), {}


def test_a_group_takes_the_spin_max_set_when_it_is_made(ranks, standin):
    """What spin_ab.py relies on: a group reads RINGREDUCE_SPIN_MAX_US when it is made."""
    if standin:
        import pytest
        pytest.skip("ringreduce's knobs")
    harness.check_results(ranks(2).run(_rank_spin_max, timeout=60))

"""The examples run as users run them: examples/train_digits.py under torchrun with 2 ranks,
each backend and each DDP wrapper, reaching over 95% test accuracy on scikit-learn's digits."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("backend,ddp", [("ringreduce", "ringreduce"), ("ringreduce", "torch"),
                                         ("gloo", "ringreduce")])
def test_train_digits(tmp_path, backend, ddp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGREDUCE_")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           os.path.join(ROOT, "examples", "train_digits.py"), "--backend", backend, "--ddp", ddp]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    m = re.search(r"test accuracy: ([\d.]+)%", p.stdout)
    # torch 2.13's gloo sometimes aborts a process in its exit handlers, after the script has
    # finished ("terminate called without an active exception"; seen in 2-3 of 20 runs of a bare
    # torch-DDP-on-gloo script with ringreduce not even loaded). Only that is forgiven, and only
    # once the run printed its result.
    gloo_teardown = (backend == "gloo" and m is not None
                     and "terminate called without an active exception" in p.stderr)
    assert (p.returncode == 0 or gloo_teardown) and m, (
        f"exit code {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-6000:]}")
    assert float(m.group(1)) > 95.0, p.stdout

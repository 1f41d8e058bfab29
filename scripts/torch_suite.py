"""torch's own DistributedTest suite, run on ringreduce beside the same run on gloo.

torch ships the suite it holds its backends to (torch.testing._internal.distributed.distributed_test,
which torch's test/distributed/test_distributed_spawn.py runs per backend). This runs it at world
size 2 with ringreduce let through every gate the suite opens for gloo (its `BACKEND == "gloo"`
conditions, `require_backend_is_available({"gloo"})`, and the backend feature sets gloo is in), then
the same selection on gloo, and compares: of the tests gloo passes, how many ringreduce passes, and
which it does not, with the first line of each failure.

    python scripts/torch_suite.py                       # the whole suite (about an hour on 2 cores)
    python scripts/torch_suite.py -k "all_reduce or barrier" --min-ratio 1.0

Exits 1 when ringreduce passes less than --min-ratio of what gloo passes. The patched copy of the
suite and each backend's JUnit report go to --out (build/torch_suite).
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The gates, as the suite writes them, and what they become: ringreduce passes where gloo does.
GATES = [
    (r'BACKEND != "gloo"', 'BACKEND not in ("gloo", "ringreduce")'),
    (r'BACKEND == "gloo"', 'BACKEND in ("gloo", "ringreduce")'),
    (r'require_backend_is_available\(\{"gloo"\}\)', 'require_backend_is_available({"gloo", "ringreduce"})'),
]

# Run before the suite's own code: the feature sets that name gloo name ringreduce too, and
# ringreduce counts as available (require_backend_is_available's check for plugins).
AFTER = '''
for _backends in DistTestCases.backend_feature.values():
    if "gloo" in _backends:
        _backends.add("ringreduce")
DistTestCases.backend_feature.setdefault("plugin", set()).add("ringreduce")
'''

SPAWN = '''
from ringreduce_distributed_test import DistributedTest, TestDistBackend


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()
'''


def write_suite(out):
    import importlib.util

    # Found, not imported: importing it needs BACKEND set, and runs the suite's set-up.
    path = importlib.util.find_spec("torch.testing._internal.distributed.distributed_test").origin
    with open(path) as f:
        src = f.read()
    for pattern, repl in GATES:
        src, n = re.subn(pattern, repl, src)
        if n == 0:
            sys.exit(f"torch_suite: no `{pattern}` in {path}: this torch's suite changed; "
                     "update GATES")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "ringreduce_distributed_test.py"), "w") as f:
        f.write("import ringreduce  # noqa: F401  (registers the backend in every rank process)\n")
        # Before the suite's decorators read them.
        f.write("from torch.testing._internal.common_distributed import DistTestCases\n")
        f.write(AFTER)
        f.write(src)
    with open(os.path.join(out, "test_torch_suite.py"), "w") as f:
        f.write(SPAWN)


def run(backend, out, world, select, timeout):
    report = os.path.join(out, f"{backend}.xml")
    env = dict(os.environ, BACKEND=backend, WORLD_SIZE=str(world),
               TEMP_DIR=tempfile.mkdtemp(prefix=f"torch-suite-{backend}-"),
               PYTHONPATH=os.pathsep.join([out, ROOT, os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", out,
           os.path.join(out, "test_torch_suite.py"), f"--junitxml={report}", "-o",
           "junit_family=xunit1"]
    if select:
        cmd += ["-k", select]
    print(f"torch_suite: {backend}: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, env=env, cwd=out, timeout=timeout, stdout=subprocess.DEVNULL)
    return outcomes(report)


def outcomes(report):
    """{test name: ("passed" | "failed" | "skipped", first line of the message)}"""
    got = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        state, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                state, why = "failed", (child.get("message") or "").strip().splitlines()[:1]
                why = why[0] if why else ""
            elif child.tag == "skipped":
                state, why = "skipped", (child.get("message") or "")
        got[name] = (state, why)
    return got


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-k", dest="select", default="", help="pytest -k expression (default: all)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--min-ratio", type=float, default=0.95,
                   help="fail below this share of gloo's passes (default 0.95)")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "torch_suite"))
    p.add_argument("--timeout", type=int, default=4 * 3600, help="per backend, in seconds")
    p.add_argument("--no-gloo", action="store_true",
                   help="run ringreduce alone: every selected test must pass (for a selection known "
                        "to pass on gloo; half the time)")
    args = p.parse_args(argv)
    write_suite(args.out)
    rr = run("ringreduce", args.out, args.world, args.select, args.timeout)
    if args.no_gloo:
        # Every test the selection names must pass, but for those skipped for want of a GPU
        # (gloo skips them as well).
        expected = sorted(n for n, (s, why) in rr.items() if not (s == "skipped" and "CUDA" in why))
    else:
        gloo = run("gloo", args.out, args.world, args.select, args.timeout)
        expected = sorted(n for n, (s, _) in gloo.items() if s == "passed")
    ours = [n for n in expected if rr.get(n, ("missing", ""))[0] == "passed"]
    extra = sorted(n for n, (s, _) in rr.items() if s == "passed" and n not in set(expected))
    ratio = len(ours) / len(expected) if expected else 1.0
    print(f"# torch's DistributedTest suite, world {args.world}"
          + (f", -k {args.select!r}" if args.select else "") + ":")
    if args.no_gloo:
        print(f"# gloo not run: ringreduce passes {len(ours)} of the {len(expected)} selected")
    else:
        print(f"# gloo passes {len(expected)} of {len(gloo)}; ringreduce passes {len(ours)} of "
              f"those ({100 * ratio:.1f}%), and {len(extra)} that gloo does not")
    for n in expected:
        state, why = rr.get(n, ("missing", ""))
        if state != "passed":
            print(f"#   {n}: {state}: {why[:200]}")
    return 0 if ratio >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())

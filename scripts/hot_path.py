"""Writes csrc/hot_path.txt: the functions of ringreduce._C that a small op runs, which setup.py
places together at the start of the module's code (docs/design.md, "The path of an op").

    python scripts/hot_path.py            # about 6 minutes on 2 cores; needs valgrind

Each path (dist.all_reduce; with async_op=True and its wait; the functional collectives' op and
wait_tensor; the direct op) runs a 1 KiB fp32 sum at world 2, with rank 1 under callgrind, once
for SHORT and once for LONG calls. A function is on the path where it ran at least
MIN_PER_CALL instructions per call more in the long run than in the short one: the calls' own
code, not the set-up's. The names are the linker's (mangled), one per line, hottest first; a
name the build no longer has is left out by the linker and found by tests/test_build.py.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHORT, LONG = 2000, 12000
MIN_PER_CALL = 0.5

DRIVER = r'''
import sys, torch, torch.distributed as dist
import ringreduce
rank, n, path, port = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
dist.init_process_group("ringreduce", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
t = torch.ones(256)
name = dist.group.WORLD.group_name
calls = {
    "sync": lambda: dist.all_reduce(t),
    "async": lambda: dist.all_reduce(t, async_op=True).wait(),
    "functional": lambda: torch.ops._c10d_functional.wait_tensor(
        torch.ops._c10d_functional.all_reduce_(t, "sum", name)),
    "direct": lambda: ringreduce.all_reduce_(t),
}
f = calls[path]
for _ in range(n):
    f()
dist.barrier()
dist.destroy_process_group()
'''


def module_path() -> str:
    import ringreduce._C

    return ringreduce._C.__file__


def run(python: str, driver: str, path: str, n: int, out: str, port: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    peer = subprocess.Popen([python, driver, "0", str(n), path, str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        subprocess.run(["valgrind", "--tool=callgrind", "--demangle=no", f"--callgrind-out-file={out}",
                        python, driver, "1", str(n), path, str(port)],
                       env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    except BaseException:
        peer.kill()  # its peer is gone: it would wait for it until its timeout
        raise
    finally:
        peer.wait(timeout=600)


def per_function(out: str, module: str) -> collections.Counter:
    """Instructions by function of `module` in one callgrind output (self cost)."""
    text = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100", out],
                          capture_output=True, text=True, check=True).stdout
    base = os.path.basename(module)
    counts = collections.Counter()
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+) (?:\([ \d.]+%\)\s+)?(\S.*?) \[(.*)\]\s*$", line)
        if m and os.path.basename(m.group(3)) == base:
            name = m.group(2)
            name = name.split(":", 1)[1] if ":" in name else name
            counts[name] += int(m.group(1).replace(",", ""))
    return counts


def defined_functions(module: str) -> dict[str, int]:
    """The module's functions: {name: address}."""
    text = subprocess.run(["nm", "--defined-only", module], capture_output=True, text=True, check=True).stdout
    return {p[2]: int(p[0], 16) for p in (line.split() for line in text.splitlines())
            if len(p) == 3 and p[1] in "tTwW"}


def with_aliases(names: list[str], defined: dict[str, int]) -> list[str]:
    """names, each followed by the other names of its code: the section a function lies in is
    named after one of them (a constructor's base-object form, C2, where callgrind may name the
    complete-object one, C1), so the list names every one."""
    at = {}
    for name, addr in defined.items():
        at.setdefault(addr, []).append(name)
    out = []
    for name in names:
        for n in [name] + sorted(set(at.get(defined.get(name), [])) - {name}):
            if n not in out:
                out.append(n)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "csrc", "hot_path.txt"))
    p.add_argument("--paths", default="sync,async,functional,direct")
    args = p.parse_args()
    module = module_path()
    names = defined_functions(module)
    hot = collections.Counter()
    with tempfile.TemporaryDirectory() as tmp:
        driver = os.path.join(tmp, "driver.py")
        with open(driver, "w") as f:
            f.write(DRIVER)
        for i, path in enumerate(args.paths.split(",")):
            got = []
            for j, n in enumerate((SHORT, LONG)):
                out = os.path.join(tmp, f"{path}.{n}.out")
                run(sys.executable, driver, path, n, out, 29400 + 10 * i + j)
                got.append(per_function(out, module))
            for name, count in got[1].items():
                per_call = (count - got[0][name]) / (LONG - SHORT)
                if per_call >= MIN_PER_CALL and name in names:
                    hot[name] = max(hot[name], per_call)
            print(f"{path}: {sum(1 for n in hot)} functions so far", flush=True)
    listed = with_aliases([name for name, _ in hot.most_common()], names)
    with open(args.out, "w") as f:
        for name in listed:
            f.write(name + "\n")
    print(f"wrote {len(listed)} names of {len(hot)} functions to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

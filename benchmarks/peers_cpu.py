"""The CPU-speed probe of benchmarks/peers.py, and the CPU's name for its header.

On a shared VM a launch can land where a CPU itself runs slower: the same Python + torch work
takes ~1.7x as long as in the next launch, with no communication involved. At 1 KiB an
all-reduce is CPU-bound work of that kind, so it slows by as much, and a slow launch of the
machine would read as a slow launch of the backend. Each launch therefore carries a probe of the
CPU's speed, taken with as many processes running it at once as the launch has ranks: in the
ranks themselves (peers_ranks.py), or for the native drivers, which are C programs, in processes
forked by the launcher (cpu_probe_processes).

Standard library only: the ranks import it in whichever venv they run.
"""

from __future__ import annotations

import math
import os
import platform
import time

# The CPU-speed probe (cpu_probe): PROBE_CHUNKS runs of a pure-Python loop of PROBE_ITERS additions,
# about 1 ms each here, 20 ms in all. A launch whose probe is over SLOW_CPU x the best probe at its
# world is counted as "CPU slow" in the spread table.
PROBE_ITERS = 40_000
PROBE_CHUNKS = 20
SLOW_CPU = 1.3


def cpu_probe() -> float:
    """ns per iteration of a fixed pure-Python loop: the fastest of PROBE_CHUNKS chunks, so that a
    chunk stretched by the scheduler (another process took the core during it) does not count,
    while a CPU that runs slowly through the whole probe does."""
    best = math.inf
    for _ in range(PROBE_CHUNKS):
        x = 0
        start = time.perf_counter()
        for i in range(PROBE_ITERS):
            x += i
        best = min(best, time.perf_counter() - start)
    return best / PROBE_ITERS * 1e9


def cpu_probe_processes(count: int) -> float:
    """The probe in `count` forked processes started together (the native drivers' launches are
    C programs under mpiexec, so the launcher takes their probe in its own processes, just
    before and just after the launch): the slowest process's result, as the ranks report the
    slowest rank's."""
    start = time.monotonic() + 0.005  # every child waits for this, so that all of them overlap
    children = []
    for _ in range(count):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: nothing but the probe, then out without the parent's clean-up
            code = 1
            try:
                os.close(read)
                while time.monotonic() < start:
                    pass
                os.write(write, repr(cpu_probe()).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        children.append((pid, read))
    results = []
    for pid, read in children:
        with os.fdopen(read, "rb") as f:
            text = f.read()
        _, status = os.waitpid(pid, 0)
        if not text:
            raise RuntimeError(f"the CPU probe's process {pid} ended with status {status} and no result")
        results.append(float(text))
    return max(results)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


"""Intel MPI and oneCCL for benchmarks/peers.py: where they are installed, how their drivers are
built, and how they are launched.

Both come from PyPI into .venv-intel (`make bench-peers` sets it up; see the Makefile for why a
venv of its own and why pinned versions): impi-rt and impi-devel bring Intel MPI's libmpi.so.12,
its mpiexec (hydra), mpicc and mpicxx, and libfabric with its providers; oneccl-cpu and
oneccl-cpu-devel bring libccl.so.1 and its C++ headers. The drivers are small programs in
benchmarks/peers/ (impi_allreduce.c, ccl_allreduce.cpp, and timing.h, the timing protocol they
share with peers_ranks.py's Python workers). `build` compiles them with that venv's compiler
wrappers into build/peers/ on first use, and again when a source or the venv changes.

Every launch names the venv's own programs and libraries by absolute path (mpiexec, and
LD_LIBRARY_PATH, FI_PROVIDER_PATH and I_MPI_ROOT, as the packages' own activation scripts set
them), so neither driver can meet Open MPI's mpirun or libmpi on the way. The settings:

- Intel MPI: `mpiexec -n WORLD` with I_MPI_FABRICS=shm (shared memory only, one host) and
  I_MPI_PIN=0 (ranks not bound to cores, like the torch ranks and Open MPI's `--bind-to none`).
- oneCCL: under the same mpiexec with the same two settings, as oneCCL's CPU samples run. The
  driver takes MPI_COMM_WORLD's rank and size, rank 0 creates the key-value store and broadcasts
  its address over MPI. Under an MPI launcher oneCCL moves data over its MPI transport (Intel
  MPI's point-to-point) with its own algorithms. CCL_SETTINGS below is the one setting this
  module adds to oneCCL's defaults, with the reason.

Variables named I_MPI_*, CCL_* or FI_* in the caller's environment reach the ranks and override
these (to try another algorithm: I_MPI_ADJUST_ALLREDUCE=N, CCL_ALLREDUCE=ring, ...); the report's
header lists the ones that were set.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_ROOT = os.path.join(REPO, ".venv-intel")
BUILD_DIR = os.path.join(REPO, "build", "peers")
DRIVERS_DIR = os.path.join(HERE, "peers")
NATIVE = ("impi", "ccl")
SOURCES = {"impi": "impi_allreduce.c", "ccl": "ccl_allreduce.cpp"}
# The pip distribution whose version the header shows, beside what the library says of itself.
PACKAGES = {"impi": "impi_rt", "ccl": "oneccl_cpu"}
IMPI_SETTINGS = {"I_MPI_FABRICS": "shm", "I_MPI_PIN": "0"}
# oneCCL's default runs each operation on a worker thread of its own (CCL_WORKER_OFFLOAD=1,
# CCL_WORKER_COUNT=1), pinned to a core of its choosing (CCL_LOG_LEVEL=info shows "worker: 0,
# cpu: 1" for both ranks of 2 on 2 cores), while the calling thread waits for it: two threads per
# rank. With as many cores as ranks that made every all-reduce take 12-80 ms from 8 KiB to 1 MiB
# (world 2, 2 cores; 10-20 ms with the workers pinned apart, CCL_WORKER_AFFINITY=0,1), against
# 8-16 us at 8 KiB and 107-117 us at 1 MiB with CCL_WORKER_OFFLOAD=0, which runs the operation on
# the calling thread: one thread per rank, as every other column has. Its algorithm and transport
# stay oneCCL's own: none of CCL_ALLREDUCE=direct|ring|rabenseifner|recursive_doubling|2d or
# CCL_ATL_TRANSPORT=ofi was faster (docs/results.md).
CCL_SETTINGS = {"CCL_WORKER_OFFLOAD": "0"}
ENV_PREFIXES = ("I_MPI_", "CCL_", "FI_")


class NativeProblem(RuntimeError):
    """A driver that could not be built or probed; the message says why in one line."""


def shown(path: str) -> str:
    """A path as messages show it: relative to the repository when inside it."""
    full = os.path.abspath(path)
    return os.path.relpath(full, REPO) if full.startswith(REPO + os.sep) else path


def missing(name: str, root: str) -> str:
    """Why `name` cannot run from `root` (a "-" column's reason), or "" when everything is there."""
    need = [os.path.join(root, "bin", "mpiexec"), os.path.join(root, "lib", "libmpi.so.12")]
    if name == "impi":
        need.append(os.path.join(root, "bin", "mpicc"))
    else:
        need += [os.path.join(root, "bin", "mpicxx"), os.path.join(root, "include", "oneapi", "ccl.hpp"),
                 os.path.join(root, "lib", "libccl.so.1")]
    absent = [shown(p) for p in need if not os.path.exists(p)]
    if absent:
        return f"not installed: no {', '.join(absent)}; `make bench-peers` sets up {shown(root)}"
    if name == "ccl" and not os.path.exists(os.path.join(root, "lib", "libccl.so.2")):
        return (f"not installed: no {shown(os.path.join(root, 'lib', 'libccl.so.2'))}, which libccl.so.1 needs "
                "and oneccl-cpu's wheel lacks; `make bench-peers` copies it from the oneccl wheel of the same release")
    return ""


def package_version(name: str, root: str) -> str:
    """The installed pip distribution's version, from its dist-info folder's name."""
    pattern = os.path.join(root, "lib", "python*", "site-packages", f"{PACKAGES[name]}-*.dist-info")
    found = sorted(glob.glob(pattern))
    return os.path.basename(found[-1])[len(PACKAGES[name]) + 1:-len(".dist-info")] if found else "unknown"


def environment(name: str, root: str, base: dict) -> dict:
    """The environment of a launch: the venv's libraries and programs first, then the settings,
    then whatever I_MPI_*, CCL_* and FI_* variables the caller set, which win."""
    root = os.path.abspath(root)
    lib = os.path.join(root, "lib")
    env = dict(base)
    env.update(I_MPI_ROOT=root, FI_PROVIDER_PATH=lib, OMP_NUM_THREADS="1",
               LD_LIBRARY_PATH=os.pathsep.join(x for x in (lib, base.get("LD_LIBRARY_PATH")) if x),
               PATH=os.pathsep.join(x for x in (os.path.join(root, "bin"), base.get("PATH")) if x))
    settings = dict(IMPI_SETTINGS)
    if name == "ccl":
        env["CCL_ROOT"] = root
        settings.update(CCL_SETTINGS)
    for key, value in settings.items():
        env.setdefault(key, value)
    return env


def settings(name: str) -> dict:
    """What a launch of `name` sets, as the header shows it (the caller's own variables aside)."""
    return {**IMPI_SETTINGS, **(CCL_SETTINGS if name == "ccl" else {})}


def from_caller(base: dict) -> dict:
    """The caller's I_MPI_*, CCL_* and FI_* variables, which reach the ranks as they are."""
    return {k: v for k, v in sorted(base.items()) if k.startswith(ENV_PREFIXES)}


def compile_command(name: str, root: str, out: str) -> list[str]:
    root = os.path.abspath(root)
    src = os.path.join(DRIVERS_DIR, SOURCES[name])
    if name == "impi":
        return [os.path.join(root, "bin", "mpicc"), "-cc=gcc", "-O2", "-std=c11", "-Wall", "-o", out, src, "-lm"]
    lib = os.path.join(root, "lib")
    # -rpath-link: libccl.so.1 names libccl.so.2, which the linker looks for beside it.
    return [os.path.join(root, "bin", "mpicxx"), "-cxx=g++", "-O2", "-std=c++17", "-Wall",
            "-I" + os.path.join(root, "include"), "-o", out, src, "-L" + lib, "-Wl,-rpath-link," + lib, "-lccl", "-lm"]


def build(name: str, root: str, build_dir: str = BUILD_DIR) -> str:
    """The driver's binary, compiled first when it is missing, older than its sources, or was
    built against another venv or with another command. Compiles to a temporary name and renames,
    so that a concurrent run never sees half a binary."""
    os.makedirs(build_dir, exist_ok=True)
    binary = os.path.join(build_dir, os.path.splitext(SOURCES[name])[0])
    command = compile_command(name, root, binary + ".tmp")
    stamp = binary + ".cmd"
    sources = [os.path.join(DRIVERS_DIR, SOURCES[name]), os.path.join(DRIVERS_DIR, "timing.h")]
    try:
        with open(stamp) as f:
            fresh = f.read() == json.dumps(command) and all(
                os.path.getmtime(binary) >= os.path.getmtime(s) for s in sources)
    except OSError:
        fresh = False
    if fresh:
        return binary
    env = dict(os.environ, I_MPI_ROOT=os.path.abspath(root))
    try:
        out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeProblem(f"cannot compile {SOURCES[name]}: {e}") from e
    if out.returncode != 0:
        errors = [x for x in out.stderr.splitlines() if "error" in x] or out.stderr.splitlines() or ["(no output)"]
        raise NativeProblem(f"cannot compile {SOURCES[name]}: {errors[0].strip()}")
    os.replace(binary + ".tmp", binary)
    with open(stamp, "w") as f:
        f.write(json.dumps(command))
    return binary


def command(root: str, binary: str, world: int, driver_args: list[str]) -> list[str]:
    """One launch: the venv's own mpiexec (hydra), `world` ranks of the driver on this host."""
    return [os.path.join(os.path.abspath(root), "bin", "mpiexec"), "-n", str(world), binary, *driver_args]


def probe(name: str, root: str, timeout: float, build_dir: str = BUILD_DIR) -> dict:
    """Build the driver and run it once, on one rank, under mpiexec: what the library says of its
    version, the package's version and the binary. Raises NativeProblem with the reason."""
    binary = build(name, root, build_dir)
    env = environment(name, root, dict(os.environ))
    try:
        out = subprocess.run(command(root, binary, 1, ["--version"]), capture_output=True, text=True,
                             env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise NativeProblem(f"its driver took over {timeout:.0f} s to say its version") from e
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = [x.strip() for x in (out.stderr + out.stdout).splitlines() if x.strip()] or ["(no output)"]
        raise NativeProblem(f"its driver failed to start (exit {out.returncode}): {tail[-1]}")
    info = json.loads(lines[-1])
    info["package"] = package_version(name, root)
    info["binary"] = binary
    return info

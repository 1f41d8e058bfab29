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
and gloo need nothing but this repository's .venv. The "rr-c++" column (`--peers` names it `cxx`)
is the same direct op with its timed calls looped in C++, as the Intel MPI and oneCCL drivers
loop in C: what the op costs without the Python interpreter's per-call cost.

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
  all-reduce is CPU-bound, so it slows with it. Each launch carries a CPU-speed probe (peers_cpu.py:
  a fixed pure-Python loop, in as many processes at once as the launch has ranks, just before and
  after the timed sizes), and the spread table splits each backend's launches into CPU-normal and
  CPU-slow ones, so a launch where the CPU ran slow does not read as a slow launch of a backend.
  The probe keeps its fastest run: it measures the CPU's speed, not its share, and a launch slowed
  by other processes on the cores reads CPU-normal.
- One timing loop for every backend (peers_ranks.py, `time_sizes`): at each size, WARMUP untimed
  iterations, batches of the timed loop until one lasts a tenth of --seconds on the slowest rank (the
  count of timed iterations comes from that batch, so it is the same on every rank), a barrier, then
  that many iterations; the time is the slowest rank's mean. Barriers and that
  bookkeeping go through a separate channel (a gloo group, or MPI's own), never through the
  collective being measured. The native drivers follow the same protocol in C
  (benchmarks/peers/timing.h) and write the same JSON.
- After the timing, each size runs once more on known inputs and every rank checks the sum, so a
  backend that quietly does something else is caught rather than timed.
- DeepSpeed falls back to the process group's all_reduce (here gloo) when its shm op cannot run,
  and says so nowhere; every DeepSpeed rank checks that the op is loaded and in use before timing
  (`deepspeed_shm_problem`), and the column reads "n/a" with the reason otherwise.

This file is the command line; the rest lives beside it, one responsibility a module, each
depending only on those above it:
    peers_cpu.py     the CPU-speed probe
    peers_native.py  Intel MPI and oneCCL: their drivers' build, environment and launch
    peers_ranks.py   inside the ranks: the timing loop, the workers, the peers' probe (the file
                     that every rank runs, with a sub-command)
    peers_launch.py  the backends as the parent sees them: probing the peers, one launch
    peers_report.py  the results over the rounds, the header, the tables and the JSON
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import tempfile

from ringreduce.bench import parse_size, size_arg, size_sweep

SCRIPT = os.path.abspath(__file__)
if os.path.dirname(SCRIPT) not in sys.path:  # the modules beside this file
    sys.path.insert(0, os.path.dirname(SCRIPT))
import peers_native  # noqa: E402
from peers_launch import (  # noqa: E402
    DEFAULT_PEERS_PYTHON, ESSENTIAL, LABELS, PEERS, LaunchFailed, Peer, last_line, launch, probe_peer)
from peers_ranks import BACKENDS, DTYPES  # noqa: E402
from peers_report import Results, header, spread, table, write_json  # noqa: E402

DEFAULT_SIZES = ["1K", "8K", "64K", "512K", "1M", "4M", "64M"]
# What --peers chooses from: the peers, and ringreduce's direct op looped in C++ (rr-c++).
CHOSEN = ("cxx",) + PEERS


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="benchmarks/peers.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-g", "--nproc", type=int, nargs="+", default=[2, 4], help="world sizes (default 2 4)")
    p.add_argument("--sizes", type=size_arg, nargs="+",
                   help=f"message sizes per rank (default {' '.join(DEFAULT_SIZES)})")
    p.add_argument("-b", "--minbytes", type=size_arg, help="sweep from this size (with -e, -f)")
    p.add_argument("-e", "--maxbytes", type=size_arg, help="sweep to this size")
    p.add_argument("-f", "--stepfactor", type=int, default=8, help="sweep factor (default 8)")
    p.add_argument("-d", "--dtype", choices=DTYPES, default="float32")
    p.add_argument("--launches", "--rounds", dest="rounds", type=int, default=3, metavar="N",
                   help="launches per backend, each in fresh processes with a fresh rendezvous, in rounds "
                        "with the order rotated; the table has the median, and with N > 1 a second table "
                        "each size's best, median and worst launch (default 3; --rounds is the same option)")
    p.add_argument("--seconds", type=float, default=0.2, help="timed seconds per size and launch (default 0.2)")
    p.add_argument("--peers", default="all",
                   help=f"comma list of {', '.join(CHOSEN)}; or all (default) or none (cxx: ringreduce's "
                        "direct op looped in C++, the rr-c++ column)")
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
        args.sizes = size_sweep(lo, hi, args.stepfactor)
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
        args.peers = list(CHOSEN)
    elif chosen == {"none"}:
        args.peers = []
    elif chosen <= set(CHOSEN):
        args.peers = [x for x in CHOSEN if x in chosen]
    else:
        p.error(f"--peers takes a comma list of {', '.join(CHOSEN)}, or all, or none; got {args.peers!r}")
    args.command = shlex.join(["python", os.path.relpath(SCRIPT), *argv])
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.started = datetime.datetime.now().isoformat(timespec="seconds")
    peers = {name: Peer(name, sys.executable) for name in ("ringreduce", "direct", "gloo")}
    peers["cxx"] = Peer("cxx", sys.executable, missing="" if "cxx" in args.peers else "left out by --peers")
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
                        peer.na = f"its launch failed: {last_line(str(e))}"
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
    sys.exit(main(sys.argv[1:]))

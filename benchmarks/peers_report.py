"""The report of benchmarks/peers.py: every launch's rows gathered over the rounds (Results), the
header, the nccl-tests-like table and its summary lines, the spread table and the JSON records."""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import socket
import statistics
import sys
import textwrap
from dataclasses import dataclass, field

from ringreduce.bench import format_size

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # the modules beside this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_native  # noqa: E402
from peers_cpu import PROBE_CHUNKS, PROBE_ITERS, SLOW_CPU, cpu_model  # noqa: E402
from peers_launch import ESSENTIAL, LABELS, MPIRUN_FLAGS, PEERS, Peer  # noqa: E402
from peers_ranks import BACKENDS, CALIBRATE_SHARE, DTYPES, MIN_ITERS, WARMUP  # noqa: E402


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
        f"{os.cpu_count()} cores, {cpu_model()}; Python {platform.python_version()}",
        f"# torch {_version('torch')}, ringreduce {_version('ringreduce')}"
        + (f"; RINGREDUCE_ALGO={algo} in ringreduce's ranks" if algo else ""),
        f"# command: {args.command}",
        f"# timing, the same for every backend: per size, {WARMUP} untimed iterations, a barrier, then as many "
        f"iterations as last ~{args.seconds:g} s (at least {MIN_ITERS}; the count from batches of the timed loop, "
        f"the last lasting {CALIBRATE_SHARE:g} of that on the slowest rank, the same on every rank); "
        "time = the slowest rank's mean iteration",
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
             "probe the slower of the two. Taken in the ranks (after a barrier) for ringreduce, rr-direct, rr-c++, gloo, "
             "OpenMPI (mpi4py) and DeepSpeed; for Intel MPI and oneCCL (C programs) in min(world, cores) processes "
             "forked by peers.py immediately before and after the launch")
    lines += ["# " + x for x in textwrap.wrap(probe, 118)]
    if peers["direct"].na:
        lines.append(f"# rr-direct: n/a ({peers['direct'].na})")
    cxx = peers["cxx"]
    if cxx.missing:
        lines.append(f"# rr-c++: - ({cxx.missing})")
    else:
        lines.append("# rr-c++: the same direct op in a launch of its own, its timed calls looped in C++ "
                     "(ringreduce._C._time_all_reduce_: torch.ops.ringreduce.all_reduce_ through the dispatcher, "
                     "as a C++ program calls it), as Intel MPI's and oneCCL's drivers loop in C")
        if cxx.na:
            lines.append(f"# rr-c++: n/a ({cxx.na})")
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
    label, root = LABELS[peer.name], peers_native.shown(peer.python)
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

"""A cost model of ringreduce's all-reduce algorithms: per-link latency (alpha) and time per byte
(beta) for shared memory and for TCP, fitted from one measurement run, and the time each
algorithm takes for a layout (hosts x ranks per host) and a message size.

    python -m ringreduce.model                          # the cluster table from the kept fit
    python -m ringreduce.model --layout 2x2 --size 64M  # each algorithm's time, and the pick
    python -m ringreduce.model --params model.json      # a fit kept by benchmarks/tcp_netns.py

The algorithms, for n = hosts x per_host ranks and a message of M bytes (each link's beta is the
time per byte of one direction of it):

- ring (flat): 2(n-1) steps, each as slow as its slowest hop (TCP once the ring crosses hosts),
  and 2(n-1)/n M bytes through every hop:  2(n-1) a + 2(n-1)/n M b.
- hierarchical (ranks on several hosts, as many on each): a ring inside each host (reduce-scatter
  then all-gather: 2(L-1) steps over shared memory, 2(L-1)/L M bytes) and L rings across hosts at
  once, each carrying M/L, which share their host's link: 2(h-1) steps, 2(h-1)/h M bytes through
  the link.
- oneshot, twoshot (one host, messages up to the shared window): one exchange in which every rank
  reads the n-1 others' inputs, (n-1) M bytes; two exchanges of 2(n-1)/n M bytes.

Ranks that outnumber their cores share them (the benchmark's "hosts" are namespaces of one machine,
so all its ranks share its cores): each link's time per byte is then multiplied by
(ranks / cores) ** share, where `share` is a third parameter per link, fitted from the layouts with
more ranks than cores (shared memory from the one-host ring, TCP from the ring across hosts with
several ranks each): moving a byte through shared memory is the ranks' own CPU work, so it slows
down about as the cores are divided (share near 1 or above, with the context switches); TCP's work
is partly the kernel's and the link's, so it slows down less. With a core per rank the factor is 1
and the fit is alpha and beta alone. Latency under oversubscription (a context switch per hand-off)
is not modelled: alpha is fitted at one rank per core.
The model ignores what a real network adds (switch hops, congestion between hosts) and what caches
do to small messages (the one-host crossovers in algo/select.cpp are measured, not modelled).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re

from .sizes import format_size, size_arg
import sys
from dataclasses import asdict, dataclass, field

PARAMS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model_params.json")
ALGOS = ("ring", "hierarchical", "oneshot", "twoshot")
WINDOW_BYTES = 1 << 20  # RINGREDUCE_WINDOW_BYTES' default: the largest one-shot/two-shot message


@dataclass
class Link:
    alpha: float  # seconds per step (a hand-off between two ranks)
    beta: float   # seconds per byte through one direction
    share: float = 0.0  # beta grows as (ranks / cores) ** share where ranks outnumber cores

    @property
    def bandwidth(self) -> float:
        return 1.0 / self.beta if self.beta > 0 else math.inf


@dataclass
class Params:
    shm: Link
    tcp: Link
    cores: int = 0          # cores the measured ranks shared (0: as many as ranks)
    source: str = ""        # where the fit came from (command, date, machine)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @staticmethod
    def from_json(text: str) -> "Params":
        d = json.loads(text)
        return Params(shm=Link(**d["shm"]), tcp=Link(**d["tcp"]), cores=d.get("cores", 0),
                      source=d.get("source", ""), extra=d.get("extra", {}))


def load(path: str | None = None) -> Params:
    with open(path or PARAMS_FILE) as f:
        return Params.from_json(f.read())


# ------------------------------------------------------------------------------------------------
# the algorithms' costs


def terms(algo: str, hosts: int, per_host: int, nbytes: int) -> dict[str, tuple[float, float]] | None:
    """What `algo` costs on each kind of link: {link: (steps, bytes through the busiest direction)},
    or None where the algorithm does not apply to the layout."""
    n = hosts * per_host
    if n < 1:
        raise ValueError(f"a layout of {hosts} x {per_host} ranks")
    if n == 1:
        return {"shm": (0.0, 0.0)}
    link = "tcp" if hosts > 1 else "shm"
    if algo == "ring":
        return {link: (2.0 * (n - 1), 2.0 * (n - 1) / n * nbytes)}
    if algo == "hierarchical":
        if hosts < 2 or per_host < 2:
            return None
        return {"shm": (2.0 * (per_host - 1), 2.0 * (per_host - 1) / per_host * nbytes),
                "tcp": (2.0 * (hosts - 1), 2.0 * (hosts - 1) / hosts * nbytes)}
    if algo in ("oneshot", "twoshot"):
        if hosts > 1 or nbytes > WINDOW_BYTES:
            return None
        if algo == "oneshot":
            return {"shm": (2.0, (n - 1) * float(nbytes))}
        return {"shm": (4.0, 2.0 * (n - 1) / n * nbytes)}
    raise ValueError(f"unknown algorithm {algo!r} (one of {', '.join(ALGOS)})")


def crowding(p: Params, ranks_sharing: int, cores: int | None = None) -> float:
    """Ranks per core when `ranks_sharing` ranks share `cores` cores (default: the fitted
    machine's), at least 1."""
    cores = p.cores if cores is None else cores
    return max(1.0, ranks_sharing / cores) if cores > 0 else 1.0


def predict(p: Params, algo: str, hosts: int, per_host: int, nbytes: int,
            ranks_sharing: int | None = None, cores: int | None = None) -> float | None:
    """Seconds an all-reduce of `nbytes` per rank takes with `algo`, or None where it does not apply.
    `ranks_sharing` ranks (default per_host: each host has its own) share `cores` cores (default the
    fitted machine's; 0: a core per rank)."""
    t = terms(algo, hosts, per_host, nbytes)
    if t is None:
        return None
    crowd = crowding(p, per_host if ranks_sharing is None else ranks_sharing, cores)
    total = 0.0
    for name, (steps, nb) in t.items():
        link: Link = getattr(p, name)
        total += steps * link.alpha + nb * link.beta * crowd ** link.share
    return total


def pick(p: Params, hosts: int, per_host: int, nbytes: int, ranks_sharing: int | None = None,
         cores: int | None = None):
    """(algorithm, seconds) of the fastest algorithm the model sees for the case."""
    best = None
    for a in ALGOS:
        t = predict(p, a, hosts, per_host, nbytes, ranks_sharing, cores)
        if t is not None and (best is None or t < best[1]):
            best = (a, t)
    return best


# ------------------------------------------------------------------------------------------------
# fitting


def fit_link(points) -> Link:
    """alpha and beta from `points` = [(steps, bytes, seconds, slow)], minimising the squared
    relative error of steps * alpha + bytes * beta * slow (so small and large messages weigh alike).
    Neither comes out negative: where the free fit would give one, it is fitted with that one at 0."""
    pts = [(s, b * slow, t) for s, b, t, slow in points if t > 0]
    if len(pts) < 2:
        raise ValueError(f"fitting a link needs at least two measurements, got {len(pts)}")

    def one(xs):  # least squares through the origin of t ~ c * x, relative error
        num = sum(x / t for x, t in xs)
        den = sum((x / t) ** 2 for x, t in xs)
        return num / den if den > 0 else 0.0

    # Normal equations of min sum ((s a + b' c) / t - 1)^2.
    saa = sum((s / t) ** 2 for s, b, t in pts)
    sbb = sum((b / t) ** 2 for s, b, t in pts)
    sab = sum(s * b / t ** 2 for s, b, t in pts)
    sa1 = sum(s / t for s, b, t in pts)
    sb1 = sum(b / t for s, b, t in pts)
    det = saa * sbb - sab * sab
    if det > 0:
        a = (sa1 * sbb - sb1 * sab) / det
        c = (sb1 * saa - sa1 * sab) / det
        if a >= 0 and c >= 0:
            return Link(alpha=a, beta=c)
    a_only = one([(s, t) for s, b, t in pts])
    c_only = one([(b, t) for s, b, t in pts])

    def err(a, c):
        return sum(((s * a + b * c) / t - 1) ** 2 for s, b, t in pts)

    return Link(alpha=a_only, beta=0.0) if err(a_only, 0) <= err(0, c_only) else Link(alpha=0.0, beta=c_only)


def fit_share(link: Link, points) -> float:
    """The exponent `share` that best explains `points` = [(steps, bytes, seconds, crowd)] of a link
    whose alpha and beta were fitted without crowding: seconds ~ steps a + bytes b crowd ** share.
    Only points whose byte term is at least ten times the steps' weigh in: share describes how
    bytes slow down, and a crowded middle-sized message's time is much context switching, which the
    model leaves out. 0 where no point qualifies."""
    pts = [(s, b, t, c) for s, b, t, c in points if t > 0 and c > 1 and b * link.beta >= 10 * s * link.alpha]
    if not pts:
        return 0.0

    def err(g):
        return sum(((s * link.alpha + b * link.beta * c ** g) / t - 1) ** 2 for s, b, t, c in pts)

    # The error is convex in g on [0, 4] for these terms: a golden-section search finds its minimum.
    lo, hi = 0.0, 4.0
    k = (5 ** 0.5 - 1) / 2
    for _ in range(60):
        m1, m2 = hi - k * (hi - lo), lo + k * (hi - lo)
        if err(m1) <= err(m2):
            hi = m2
        else:
            lo = m1
    return round((lo + hi) / 2, 4)


def fit(measured, cores: int = 0, source: str = "") -> Params:
    """Params from measured ring all-reduces: `measured` = [(hosts, per_host, nbytes, seconds)] of
    the flat ring, every rank on one machine of `cores` cores. Each link's alpha and beta come from
    the layouts whose ring runs on it alone with a core per rank (shared memory: one host; TCP: one
    rank per host), and its share from the layouts that crowd the cores (shared memory: one host
    with more ranks than cores; TCP: several hosts with several ranks each, whose ring waits on its
    TCP hops). Where no layout has a core per rank, alpha and beta are fitted on the crowded ones
    with share 1."""
    p0 = Params(shm=Link(0, 0), tcp=Link(0, 0), cores=cores, source=source)
    roomy = {"shm": [], "tcp": []}
    crowded = {"shm": [], "tcp": []}
    for hosts, per_host, nbytes, secs in measured:
        steps, nb = terms("ring", hosts, per_host, nbytes)["tcp" if hosts > 1 else "shm"]
        name = "tcp" if hosts > 1 else "shm"
        crowd = crowding(p0, hosts * per_host)
        if hosts > 1 and per_host > 1:  # a ring over TCP and shared memory: TCP's hops are the slow ones
            crowded["tcp"].append((steps, nb, secs, crowd))
        elif crowd > 1:
            crowded[name].append((steps, nb, secs, crowd))
        else:
            roomy[name].append((steps, nb, secs, 1.0))
    links = {}
    for name in ("shm", "tcp"):
        if roomy[name]:
            link = fit_link(roomy[name])
            link.share = fit_share(link, crowded[name])
        else:  # every layout crowded: the bytes are taken to slow down as the cores are divided
            link = fit_link([(s, b, t, c) for s, b, t, c in crowded[name]])
            link.share = 1.0
        links[name] = link
    return Params(shm=links["shm"], tcp=links["tcp"], cores=cores, source=source)


# ------------------------------------------------------------------------------------------------
# the command line

def parse_layout(text: str) -> tuple[int, int]:
    m = re.match(r"^\s*(\d+)\s*x\s*(\d+)\s*$", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError(f"cannot parse layout {text!r} (hosts x ranks per host, e.g. 2x4)")
    return int(m.group(1)), int(m.group(2))


def format_time(secs: float) -> str:
    if secs >= 1:
        return f"{secs:.2f}s"
    if secs >= 1e-3:
        return f"{secs * 1e3:.2f}ms"
    return f"{secs * 1e6:.1f}us"


def describe(p: Params) -> str:
    def one(name, link):
        share = f", share {link.share:.2f}" if p.cores else ""
        return f"{name}: alpha {link.alpha * 1e6:.2f} us, {link.bandwidth / 1e9:.2f} GB/s{share}"

    return (f"{one('shm', p.shm)}; {one('tcp', p.tcp)}"
            + (f"; fitted with {p.cores} cores shared by every rank (time per byte x (ranks / cores) ** share)"
               if p.cores else ""))


def _cores_text(cores: int) -> str:
    return f"{cores} cores per host" if cores > 0 else "a core per rank"


def layout_table(p: Params, hosts: int, per_host: int, sizes, cores: int = 0) -> list[str]:
    out = [f"# {hosts} hosts x {per_host} ranks ({_cores_text(cores)}): predicted all-reduce time per "
           "algorithm, and the pick",
           "# " + "size".rjust(8) + "".join(a.rjust(14) for a in ALGOS) + "pick".rjust(14)]
    for nb in sizes:
        cells = []
        for a in ALGOS:
            t = predict(p, a, hosts, per_host, nb, cores=cores)
            cells.append("-" if t is None else format_time(t))
        out.append("  " + format_size(nb).rjust(8) + "".join(c.rjust(14) for c in cells)
                   + pick(p, hosts, per_host, nb, cores=cores)[0].rjust(14))
    return out


def cluster_table(p: Params, hosts_list, per_host: int, sizes, cores: int = 0) -> list[str]:
    out = [f"# clusters of hosts x {per_host} ranks ({_cores_text(cores)}): flat ring and hierarchical "
           "predicted times, the hierarchical all-reduce's speed-up, and the faster one's busbw",
           "# " + "hosts".rjust(6) + "size".rjust(8) + "ring".rjust(12) + "hierarchical".rjust(14)
           + "speed-up".rjust(10) + "busbw(GB/s)".rjust(13)]
    for h in hosts_list:
        for nb in sizes:
            ring = predict(p, "ring", h, per_host, nb, cores=cores)
            hier = predict(p, "hierarchical", h, per_host, nb, cores=cores)
            best = min(t for t in (ring, hier) if t is not None)
            n = h * per_host
            busbw = nb / best * 2 * (n - 1) / n / 1e9 if n > 1 else 0.0
            out.append("  " + str(h).rjust(6) + format_size(nb).rjust(8) + format_time(ring).rjust(12)
                       + ("-" if hier is None else format_time(hier)).rjust(14)
                       + ("-" if hier is None else f"{ring / hier:.2f}x").rjust(10) + f"{busbw:.2f}".rjust(13))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", help=f"the fit to use (default: the one kept with the package, {PARAMS_FILE})")
    ap.add_argument("--layout", type=parse_layout, help="hosts x ranks per host, e.g. 2x4: each algorithm's time")
    ap.add_argument("--size", type=size_arg, action="append",
                    help="message size (repeatable; default 1K to 1G by 16x)")
    ap.add_argument("--hosts", default="1,8,128,1024",
                    help="the cluster table's host counts (default 1,8,128,1024)")
    ap.add_argument("--per-host", type=int, default=8, help="the cluster table's ranks per host (default 8)")
    ap.add_argument("--cores", type=int, default=0,
                    help="cores per host, which its ranks share (default 0: a core per rank)")
    args = ap.parse_args(argv)
    try:
        p = load(args.params)
    except (OSError, ValueError, KeyError) as e:
        print(f"ringreduce.model: cannot read the fit {args.params or PARAMS_FILE}: {e}", file=sys.stderr)
        return 2
    sizes = args.size or [1 << k for k in range(10, 31, 4)]  # 1 KiB to 1 GiB
    print(f"# model: {describe(p)}")
    if p.source:
        print(f"# fitted from: {p.source}")
    if args.layout:
        print("\n".join(layout_table(p, *args.layout, sizes, args.cores)))
    else:
        hosts = [int(h) for h in args.hosts.split(",") if h.strip()]
        print("\n".join(cluster_table(p, hosts, args.per_host, sizes, args.cores)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

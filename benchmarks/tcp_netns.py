"""All-reduce over TCP between two "hosts" on one machine: ringreduce beside gloo.

    sudo python benchmarks/tcp_netns.py                       # 1 MiB, 16 MiB and 64 MiB, fp32 SUM
    sudo python benchmarks/tcp_netns.py --sizes 64M --iters 20 --sockets 4
    sudo python benchmarks/tcp_netns.py --slice 1M --slots 8  # RINGREDUCE_SLICE_BYTES / _SLOTS

What it sets up: two network namespaces joined by a veth pair (10.213.<n>.1/24 and .2/24),
each "host" also in an IPC and mount namespace of its own with a private tmpfs on /dev/shm, so
the two cannot share memory and ringreduce's ranks talk over its TCP transport, as between two
machines. In each namespace ``torchrun --nnodes 2 --nproc-per-node 1`` (c10d rendezvous on the
first namespace's address) starts one rank of a 2-rank job: this same file, with ``--worker``.
Both ranks listen on their veth address (RINGREDUCE_SOCKET_IFNAME, GLOO_SOCKET_IFNAME).

What it measures: fp32 SUM all_reduce of each size on the ringreduce group and on a gloo group
over the same two ranks, in the same run: for each size, --warmup untimed iterations of each
backend, then --iters timed iterations, ringreduce and gloo interleaved (so that a noisy
neighbour hits both alike). Each timed iteration starts after a barrier (on a third, gloo, group
that is never timed); its time is the slower rank's; the table shows the median. As in
nccl-tests, algbw = size / time and busbw = algbw * 2(n-1)/n (= algbw for n = 2); GB = 1e9 bytes;
ratio = busbw(ringreduce) / busbw(gloo). Each backend's result is checked once per size.

Both ranks and the kernel's TCP stack share this machine's cores, and a veth "wire" is a memory
copy, so the absolute figures say more about the software's overheads than about a network;
the ratio is the point. Run as root (namespaces, mounts); everything it creates is removed at
the end, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(_HERE)
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    m = _SIZE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"cannot parse size {text!r} (e.g. 1M, 64M, 1048576)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_sizes(text: str) -> list[int]:
    sizes = [parse_size(s) for s in text.split(",") if s.strip()]
    if not sizes or any(s <= 0 or s % 4 for s in sizes):
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: positive multiples of 4 bytes (fp32)")
    return sizes


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


# ---------------------------------------------------------------------------------------------------
# The rank (run by torchrun inside a namespace)


def worker(args) -> int:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("ringreduce", timeout=timedelta(seconds=args.op_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    rr = dist.group.WORLD
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.op_timeout))
    ctrl = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.op_timeout))  # barriers, max
    be = rr._get_backend(torch.device("cpu"))
    factor = 2 * (world - 1) / world

    where = [None] * world
    dist.all_gather_object(where, f"{os.environ.get('RR_NETNS_HOST_ADDR', '?')} "
                                  f"(tcp_address {be.tcp_address()}, tcp_peers {be.tcp_peers()})", group=ctrl)
    backends = [("ringreduce", rr), ("gloo", gloo)]

    rows = []
    for nbytes in args.sizes:
        n = nbytes // 4
        src = torch.full((n,), float(rank + 1))
        expect = float(world * (world + 1) // 2)
        bufs = {name: torch.empty(n) for name, _ in backends}
        for name, g in backends:
            for i in range(args.warmup):
                bufs[name].copy_(src)
                dist.all_reduce(bufs[name], group=g)
                if i == 0 and not bool((bufs[name] == expect).all()):
                    raise RuntimeError(f"{name} all_reduce of {nbytes} bytes gave a wrong result on rank {rank}")
        times = {name: [] for name, _ in backends}
        for _ in range(args.iters):
            for name, g in backends:
                bufs[name].copy_(src)
                dist.barrier(group=ctrl)
                t0 = time.perf_counter()
                dist.all_reduce(bufs[name], group=g)
                times[name].append(time.perf_counter() - t0)
        # Each iteration's time is the slower rank's.
        t = torch.tensor([times[name] for name, _ in backends], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
        med = {name: statistics.median(t[i].tolist()) for i, (name, _) in enumerate(backends)}
        rows.append((nbytes, med))
        if rank == 0:
            print(f"# measured {format_size(nbytes)}", file=sys.stderr, flush=True)

    if rank == 0:
        cols = [("size(B)", 12), ("count", 10)]
        for name, _ in backends:
            cols += [("time(us)", 10), ("algbw(GB/s)", 11), ("busbw(GB/s)", 11)]
        cols += [("ratio", 7)]
        widths = [w if len(c) <= w else len(c) for c, w in cols]

        def line(prefix, cells):
            return prefix + " ".join(c.rjust(w) for c, w in zip(cells, widths))

        env = {k: os.environ.get(k) for k in ("RINGREDUCE_TCP_SOCKETS", "RINGREDUCE_SLICE_BYTES",
                                              "RINGREDUCE_SLOTS", "RINGREDUCE_SOCKET_IFNAME")}
        out = [
            "# tcp_netns: all_reduce, float32, redop sum; ringreduce vs gloo over TCP between two network namespaces",
            f"# Command: {args.command}",
            f"# Date: {time.strftime('%Y-%m-%d %H:%M:%S')}",
            f"# Host: {os.cpu_count()} CPUs; torch {torch.__version__}; both ranks and the veth pair share them",
            f"# World: {world} ranks, one per namespace, no shared memory between them",
        ] + [f"#   rank {r}: {w}" for r, w in enumerate(where)] + [
            f"# ringreduce: transport {be.transport}, tcp_sockets {be.tcp_sockets}, slice_bytes {be.slice_bytes}, "
            f"slots {be.slots}; env " + ", ".join(f"{k}={v}" for k, v in env.items() if v is not None),
            f"# Timing: per size, {args.warmup} untimed iterations per backend, then {args.iters} timed ones, "
            "ringreduce and gloo interleaved, each after a barrier; time = median over iterations "
            "of the slower rank's time",
            f"# algbw = size / time, busbw = algbw * 2(n-1)/n ({world} ranks: x{factor:.3f}); GB = 1e9 bytes; "
            "ratio = busbw(ringreduce) / busbw(gloo)",
            "#",
            "# " + " ".join(part.center(w) for part, w in (
                ("", widths[0] + widths[1] + 1),
                ("ringreduce", sum(widths[2:5]) + 2),
                ("gloo", sum(widths[5:8]) + 2))).rstrip(),
            line("# ", [c for c, _ in cols]),
        ]
        for nbytes, med in rows:
            cells = [str(nbytes), str(nbytes // 4)]
            for name, _ in backends:
                s = med[name]
                cells += [f"{s * 1e6:.1f}", f"{nbytes / s / 1e9:.2f}", f"{nbytes / s / 1e9 * factor:.2f}"]
            cells.append(f"{med['gloo'] / med['ringreduce']:.2f}")
            out.append(line("  ", cells))
        nbytes, med = rows[-1]
        ratio = med["gloo"] / med["ringreduce"]
        out.append(f"# {format_size(nbytes)}: ringreduce busbw = {ratio:.2f}x gloo over TCP between two "
                   f"network namespaces")
        text = "\n".join(out)
        print(text, flush=True)
        if args.table:
            with open(args.table, "w") as f:
                f.write(text + "\n")

    dist.barrier(group=ctrl)
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # without the interpreter's teardown (gloo sometimes aborts in its exit handlers)


# ---------------------------------------------------------------------------------------------------
# The two hosts


def run(args) -> int:
    if os.geteuid() != 0:
        print("tcp_netns: needs root (network namespaces, mounts): sudo python benchmarks/tcp_netns.py",
              file=sys.stderr)
        return 2
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            print(f"tcp_netns: `{tool}` is not installed", file=sys.stderr)
            return 2

    sys.path.insert(0, _REPO)
    from ringreduce._netns import (destroy_hosts, make_hosts, private_shm_prefix,
                                   stop_process_group, wait_both)

    tag = str(os.getpid())
    hosts = None
    tmp = tempfile.mkdtemp(prefix="rr_tcp_netns_")
    table = os.path.join(tmp, "table.txt")
    procs, logs = [], []
    try:
        hosts = make_hosts(tag, 16 + os.getpid() % 200)
        base = {k: v for k, v in os.environ.items()
                if not k.startswith(("RINGREDUCE_", "TORCHELASTIC_"))
                and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
        base["PYTHONPATH"] = os.pathsep.join([_REPO] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p])
        for var, value in (("RINGREDUCE_TCP_SOCKETS", args.sockets), ("RINGREDUCE_SLICE_BYTES", args.slice),
                           ("RINGREDUCE_SLOTS", args.slots)):
            if value is not None:
                base[var] = str(value)
        worker_args = ["--worker", "--sizes", ",".join(str(s) for s in args.sizes), "--iters", str(args.iters),
                       "--warmup", str(args.warmup), "--op-timeout", str(args.op_timeout),
                       "--table", table, "--command", args.command]
        for k in range(2):
            env = dict(base, RR_NETNS_HOST_ADDR=hosts.addr[k], GLOO_SOCKET_IFNAME=hosts.veth[k],
                       RINGREDUCE_SOCKET_IFNAME=hosts.veth[k])
            cmd = private_shm_prefix(hosts.ns[k]) + [
                sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--node-rank", str(k), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.addr[0]}:29400",
                "--rdzv-id", f"rr-tcp-netns-{tag}",
                # Both namespaces share the machine's hostname, by which torchrun would otherwise
                # pick the store's host and the address it publishes.
                "--rdzv-conf", f"join_timeout=120,is_host={1 if k == 0 else 0}",
                "--local-addr", hosts.addr[k], "--max-restarts", "0",
                os.path.abspath(__file__), *worker_args]
            log = open(os.path.join(tmp, f"torchrun_{k}.log"), "w+")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=env, cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        print(f"# two namespaces {hosts.ns[0]} ({hosts.addr[0]}) and {hosts.ns[1]} ({hosts.addr[1]}); "
              f"running (logs in {tmp}) ...", file=sys.stderr, flush=True)
        codes, _ = wait_both(procs, args.timeout, grace=15)  # after a failure, the other won't finish
        ok = codes == [0, 0] and os.path.exists(table)
        if not ok:
            for k, log in enumerate(logs):
                log.flush()
                log.seek(0)
                status = "still running (killed)" if codes[k] is None else f"exit {codes[k]}"
                print(f"==== torchrun in {hosts.ns[k]} ({hosts.addr[k]}): {status} ====", file=sys.stderr)
                print(log.read()[-12000:], file=sys.stderr)
            return 1
        with open(table) as f:
            print(f.read(), end="", flush=True)
        return 0
    finally:
        for p in procs:
            stop_process_group(p)
        if hosts is not None:
            destroy_hosts(hosts)
        for log in logs:
            log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("1M,16M,64M"),
                    help="comma-separated message sizes in bytes, K/M/G suffixes (default 1M,16M,64M)")
    ap.add_argument("--iters", type=int, default=10, help="timed iterations per size and backend (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations per size and backend (default 2)")
    ap.add_argument("--sockets", type=int, help="RINGREDUCE_TCP_SOCKETS: TCP connections per peer")
    ap.add_argument("--slice", help="RINGREDUCE_SLICE_BYTES: the ring's slice size (e.g. 512K)")
    ap.add_argument("--slots", type=int, help="RINGREDUCE_SLOTS: slices in flight per link")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole run (default 300)")
    ap.add_argument("--op-timeout", type=float, default=120.0, help="process-group timeout in seconds")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--table", help=argparse.SUPPRESS)
    ap.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.iters < 1 or args.warmup < 1:
        ap.error("--iters and --warmup must be at least 1")
    if args.command is None:
        args.command = " ".join(shlex.quote(a) for a in [os.path.relpath(sys.argv[0])] + sys.argv[1:])
    if args.worker:
        return worker(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

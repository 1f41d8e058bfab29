"""A real two-host job on one machine: two network namespaces joined by a veth pair, each with
its own IPC and mount namespace and a private tmpfs on /dev/shm, so the "hosts" share no memory
and every byte between them crosses TCP on the namespaces' own addresses.

In each namespace ``torchrun --nnodes 2 --nproc-per-node 2`` (c10d rendezvous on host A's
veth address) starts two ranks of one 4-rank job. Every rank checks that the backend reaches
exactly the two ranks of the other host over TCP, listening on its own host's veth address;
checks that every all-reduce takes the hierarchical form, which sends at most ~1x the message out
of each host's veth, and that forcing the flat ring gives the same sums; compares all_reduce (float32/float64/int64, SUM/MAX, 0/1/1000003 elements) with gloo and with
an exact or float64 reference, and checks the ringreduce results are bit-identical on every
rank; checks broadcast and all_gather; and trains a small MLP with torch's DDP on the
ringreduce group and on a gloo group (and with ringreduce.DistributedDataParallel) from the
same seed, comparing the parameters. Each rank writes a JSON result; the test asserts all four
are ok and prints both torchrun outputs when one is not.

Needs root, ``ip`` (iproute2) with network namespaces, and ``unshare``; the module is skipped
with the reason when any of them is missing or not permitted (e.g. in a CI sandbox).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ringreduce._netns import (Hosts, cmd as _cmd, destroy_hosts, kill_namespace_processes,
                              make_hosts, private_shm_prefix, stop_process_group, wait_both)

REPO = Path(__file__).resolve().parent.parent
JOB_TIMEOUT = 180.0  # seconds for one torchrun pair, start to finish
FAILURE_GRACE = 20.0  # seconds the other torchrun may still take once one has failed
RDZV_PORT = 29411

if sys.platform != "linux":
    pytest.skip("network namespaces are Linux-only", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("needs root (creates network namespaces and mounts a tmpfs)", allow_module_level=True)
for _tool in ("ip", "unshare", "mount"):
    if shutil.which(_tool) is None:
        pytest.skip(f"`{_tool}` is not installed", allow_module_level=True)


# --------------------------------------------------------------------------------------
# the rank program

WORKER = textwrap.dedent(
    r'''
    import faulthandler, hashlib, json, os, signal, sys, traceback, warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch import nn

    HOST = os.environ["RR_NETNS_HOST_ADDR"]      # this "host"'s 10.213 address
    RESULTS = os.environ["RR_NETNS_RESULTS"]
    IFNAME = os.environ.get("RINGREDUCE_SOCKET_IFNAME", "")
    VETH = os.environ["RR_NETNS_VETH"]             # this host's end of the wire
    FORCED_TCP = os.environ.get("RINGREDUCE_TRANSPORT", "") == "tcp"
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's deprecation notes
    faulthandler.register(signal.SIGUSR1, all_threads=True)    # the test asks for stacks on a hang
    rank = int(os.environ["RANK"])
    messages = []


    def check(cond, msg):
        if not cond:
            messages.append(msg)
        return cond


    def digest(t):
        flat = t.detach().reshape(-1).contiguous()
        b = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return hashlib.blake2b(b, digest_size=16).hexdigest()


    def gen(*key):
        g = torch.Generator()
        g.manual_seed(int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=7).digest(), "little"))
        return g


    def data(r, dtype, n):
        g = gen("allreduce", r, str(dtype), n)
        if dtype.is_floating_point:
            return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)


    def check_allreduce(world, gloo, digests):
        for dtype in (torch.float32, torch.float64, torch.int64):
            for n in (0, 1, 1000003):
                inputs = [data(r, dtype, n) for r in range(world)]
                for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                    name = f"all_reduce {op} {dtype} n={n}"
                    a = inputs[rank].clone()
                    b = inputs[rank].clone()
                    dist.all_reduce(a, op=op)                 # default group: ringreduce
                    dist.all_reduce(b, op=op, group=gloo)
                    digests.append((name, digest(a)))
                    if op == dist.ReduceOp.SUM:
                        ref = torch.stack([x.double() for x in inputs]).sum(0) if n else a.double()
                    else:
                        ref = torch.stack(inputs).amax(0).double() if n else a.double()
                    if dtype.is_floating_point and op == dist.ReduceOp.SUM:
                        tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
                        check(torch.allclose(a, b, **tol), f"{name}: ringreduce differs from gloo "
                              f"(max abs diff {(a.double() - b.double()).abs().max().item() if n else 0})")
                        check(torch.allclose(a.double(), ref, **tol), f"{name}: ringreduce differs from the float64 reference")
                    else:
                        check(torch.equal(a, b), f"{name}: ringreduce differs from gloo")
                        check(torch.equal(a.double(), ref), f"{name}: ringreduce differs from the exact reference")


    def check_broadcast_allgather(world, gloo):
        src = world - 1
        for n in (1, 1000003):
            want = torch.randn(n, generator=gen("bcast", n))
            t = want.clone() if rank == src else torch.full((n,), float("nan"))
            dist.broadcast(t, src=src)
            check(torch.equal(t, want), f"broadcast n={n} from rank {src}: wrong result")
        for n in (3, 250007):
            parts = [torch.randn(n, generator=gen("gather", r, n)) for r in range(world)]
            out = [torch.empty(n) for _ in range(world)]
            dist.all_gather(out, parts[rank])
            check(all(torch.equal(o, p) for o, p in zip(out, parts)), f"all_gather n={n}: wrong result")
            flat = torch.empty(world * n)
            dist.all_gather_into_tensor(flat, parts[rank])
            check(torch.equal(flat, torch.cat(parts)), f"all_gather_into_tensor n={n}: wrong result")


    def train(wrap, steps=10):
        torch.manual_seed(1234)                       # the same initial model on every rank and run
        model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
        ddp = wrap(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        g = gen("train", rank)                       # each rank its own data
        for _ in range(steps):
            x = torch.randn(16, 32, generator=g)
            y = torch.randn(16, 8, generator=g)
            opt.zero_grad(set_to_none=True)
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]


    def check_ddp(gloo, digests):
        from torch.nn.parallel import DistributedDataParallel as TorchDDP
        import ringreduce

        runs = {
            "torch DDP on ringreduce": lambda m: TorchDDP(m, process_group=dist.group.WORLD, bucket_cap_mb=0.25),
            "torch DDP on gloo": lambda m: TorchDDP(m, process_group=gloo, bucket_cap_mb=0.25),
            "ringreduce DDP on ringreduce": lambda m: ringreduce.DistributedDataParallel(m, bucket_cap_mb=0.25),
        }
        params = {name: train(wrap) for name, wrap in runs.items()}
        ref = params["torch DDP on gloo"]
        for name in ("torch DDP on ringreduce", "ringreduce DDP on ringreduce"):
            got = params[name]
            worst = max((a - b).abs().max().item() for a, b in zip(got, ref))
            check(all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, ref)),
                  f"{name}: final parameters differ from torch DDP on gloo (max abs diff {worst:.3g})")
            digests.append((name, digest(torch.cat([p.reshape(-1) for p in got]))))


    def tx_bytes():
        with open(f"/sys/class/net/{VETH}/statistics/tx_bytes") as f:
            return int(f.read())


    def check_wire(gloo):
        """The bytes between the hosts cross the veth pair: a ringreduce all_reduce of S bytes
        sends at least S/2 out of each host's veth (its ring crosses between the hosts)."""
        t = torch.ones(1 << 21, dtype=torch.float32)   # 8 MiB
        dist.barrier(group=gloo)
        before = tx_bytes()
        dist.all_reduce(t)
        dist.barrier(group=gloo)
        sent = tx_bytes() - before
        check(sent >= t.numel() * 4 // 2,
              f"{VETH} sent {sent} bytes during an all_reduce of {t.numel() * 4} bytes: the ring does not cross it")
        if not FORCED_TCP:
            # The hierarchical all-reduce sends (h-1)/h x 2 of the message out of each host (1.0x
            # for 2 hosts), the flat ring 2(n-1)/n of it (1.5x for 4 ranks): headers stay under 15%.
            check(sent <= t.numel() * 4 * 1.15,
                  f"{VETH} sent {sent} bytes during a hierarchical all_reduce of {t.numel() * 4} bytes "
                  f"(at most 1.15x expected)")


    def check_hierarchical(world, be):
        """Across two hosts of two ranks, every all-reduce takes the hierarchical form (the flat
        ring when TCP is forced: then every rank is a host of its own); forced back to the flat
        ring, it gives the same sums."""
        want = "ring" if FORCED_TCP else "hierarchical"
        for n in (0, 1024, 1 << 26):
            got = be.algorithm("allreduce", n)
            check(got == want, f"an all-reduce of {n} bytes takes {got!r}, expected {want!r} ({be.algorithms})")
        x = data(rank, torch.float64, 300007)
        ref = torch.stack([data(r, torch.float64, 300007) for r in range(world)]).sum(0)
        for algo in ("ring", "auto"):
            be.set_algorithm(algo)
            y = x.clone()
            dist.all_reduce(y)
            check(torch.allclose(y, ref, rtol=1e-12, atol=1e-12), f"all_reduce with {algo}: differs from the float64 reference")


    def main():
        dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
        world = dist.get_world_size()
        gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=60))
        be = dist.group.WORLD._get_backend(torch.device("cpu"))

        hosts = [None] * world
        dist.all_gather_object(hosts, HOST, group=gloo)
        others = sorted(r for r in range(world) if hosts[r] != HOST)
        # Over TCP: the ranks of the other host, or every other rank when TCP is forced.
        expect = sorted(r for r in range(world) if r != rank) if FORCED_TCP else others
        peers = sorted(be.tcp_peers())
        addr = be.tcp_address()
        messages_info = f"rank {rank} on {HOST}: hosts={hosts} tcp_peers={peers} tcp_address={addr} transport={be.transport}"
        print(messages_info, flush=True)
        check(len(set(hosts)) == 2 and len(others) == world // 2, f"ranks not split over two hosts: {hosts}")
        check(peers == expect, f"tcp_peers() = {peers}, expected {expect} (hosts {hosts}, forced tcp {FORCED_TCP})")
        check(addr.startswith(HOST + ":"), f"tcp_address() = {addr!r} is not on this host's address {HOST}")
        want_transport = "tcp" if FORCED_TCP else "auto"
        check(be.transport == want_transport, f"transport = {be.transport!r}, expected {want_transport!r}")
        # Peers of this machine in another network namespace cannot be handed a descriptor: the
        # ranks take named segments, each host in its own /dev/shm.
        check(FORCED_TCP or be.segments == "/dev/shm", f"segments = {be.segments!r}, expected '/dev/shm'")

        check_wire(gloo)
        check_hierarchical(world, be)
        digests = []
        check_allreduce(world, gloo, digests)
        check_broadcast_allgather(world, gloo)
        check_ddp(gloo, digests)

        everyone = [None] * world
        dist.all_gather_object(everyone, digests, group=gloo)
        for r, theirs in enumerate(everyone):
            for (name, mine), (_, d) in zip(digests, theirs):
                check(mine == d, f"{name}: result on rank {r} is not bit-identical to rank {rank}'s")
        dist.barrier(group=gloo)
        dist.destroy_process_group()
        return messages_info


    info = ""
    try:
        info = main()
    except BaseException:
        messages.append(traceback.format_exc())
    ok = not messages
    with open(os.path.join(RESULTS, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "ok": ok, "host": HOST, "ifname": IFNAME, "info": info,
                   "messages": messages}, f)
    print(f"rank {rank}: {'OK' if ok else 'FAILED'}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown (gloo sometimes aborts in its exit handlers).
    os._exit(0 if ok else 1)
    '''
)


# --------------------------------------------------------------------------------------
# the two hosts


@pytest.fixture(scope="module")
def hosts():
    tag = str(os.getpid())
    try:
        h = make_hosts(tag, 16 + os.getpid() % 200)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot create network namespaces here: {e}")
    try:
        # Each host must see a /dev/shm of its own: a file made on one is not seen on the other
        # nor on the machine's own /dev/shm.
        probe = f"rr_netns_probe_{tag}"
        try:
            a = _cmd(*private_shm_prefix(h.ns[0]), "sh", "-c", f"touch /dev/shm/{probe} && ls /dev/shm")
            b = _cmd(*private_shm_prefix(h.ns[1]), "ls", "/dev/shm")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"cannot give a network namespace a private /dev/shm here: {e}")
        assert probe in a.stdout.split(), a.stdout
        assert probe not in b.stdout.split(), f"/dev/shm is shared between the namespaces: {b.stdout}"
        assert not os.path.exists(f"/dev/shm/{probe}"), "the namespace's /dev/shm leaked to the machine's"
        yield h
    finally:
        destroy_hosts(h)


# --------------------------------------------------------------------------------------
# the job


def _clean_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RINGREDUCE_", "RR_NETNS_", "TORCHELASTIC_"))
           and k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                         "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env.pop("PYTHONWARNINGS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _dump_stacks(h: Hosts, procs, stuck):
    """Ask the ranks under the torchruns that did not finish for their Python stacks (they
    print them to the torchrun's output on SIGUSR1), and give them a moment to."""
    agents = {p.pid for p in procs}
    for k in stuck:
        for pid in _cmd("ip", "netns", "pids", h.ns[k], check=False).stdout.split():
            if int(pid) not in agents:
                try:
                    os.kill(int(pid), signal.SIGUSR1)
                except ProcessLookupError:
                    pass
    for k in stuck:
        try:
            procs[k].wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass


def run_job(h: Hosts, tmp_path: Path, *, use_ifname: bool, port: int, nproc: int = 2,
            worker: str = WORKER, extra_env: dict | None = None, timeout: float = JOB_TIMEOUT):
    """torchrun in both namespaces; returns (exit codes, outputs, results by rank)."""
    results = tmp_path / "results"
    results.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(worker)
    run_id = f"rr-netns-{os.getpid()}-{port}"
    procs, logs = [], []
    try:
        for k in range(2):
            env = _clean_env()
            env.update(extra_env or {})
            env["RR_NETNS_RESULTS"] = str(results)
            env["RR_NETNS_HOST_ADDR"] = h.addr[k]
            env["RR_NETNS_VETH"] = h.veth[k]
            # gloo (the comparison) would take the address of the hostname, 127.0.0.1 here.
            env["GLOO_SOCKET_IFNAME"] = h.veth[k]
            if use_ifname:
                env["RINGREDUCE_SOCKET_IFNAME"] = h.veth[k]
            cmd = private_shm_prefix(h.ns[k]) + [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes", "2", "--nproc-per-node", str(nproc), "--node-rank", str(k),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{h.addr[0]}:{port}", "--rdzv-id", run_id,
                # torchrun recognises the store's host by its hostname's addresses, and both
                # namespaces share the machine's hostname: say which one hosts it.
                "--rdzv-conf", f"join_timeout=120,is_host={1 if k == 0 else 0}",
                # The node's own address (both namespaces share one hostname, which resolves to
                # 127.0.0.1): torchrun publishes rank 0's as MASTER_ADDR.
                "--local-addr", h.addr[k],
                "--max-restarts", "0", str(script)]
            log = open(tmp_path / f"torchrun_{k}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        # Wait for both; once one has failed, the other gets FAILURE_GRACE more (its ranks may
        # be stuck in a collective, or its agent in torchrun's exit barrier, for minutes).
        codes, why = wait_both(procs, timeout, FAILURE_GRACE)
        stuck = [k for k in range(2) if codes[k] is None]
        if stuck:
            _dump_stacks(h, procs, stuck)
        codes = [why if c is None else c for c in codes]
    finally:
        for p in procs:
            stop_process_group(p)
        for ns in h.ns:  # ranks that outlived their torchrun
            kill_namespace_processes(ns)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    by_rank = {}
    for f in sorted(results.glob("rank*.json")):
        r = json.loads(f.read_text())
        by_rank[r["rank"]] = r
    return codes, outputs, by_rank


def _report(h, codes, outputs, by_rank, world):
    lines = []
    for k in range(2):
        lines.append(f"==== torchrun on host {k} ({h.ns[k]}, {h.addr[k]}): exit {codes[k]} ====")
        lines.append(outputs[k][-12000:])
    for r in range(world):
        res = by_rank.get(r)
        if res is None:
            lines.append(f"==== rank {r}: no result ====")
        elif not res["ok"]:
            lines.append(f"==== rank {r} ({res['host']}): FAILED ====")
            lines.extend(res["messages"])
    return "\n".join(lines)


@pytest.mark.parametrize(
    "case", ["socket_ifname", "routed_to_store", "forced_tcp"])
def test_two_hosts_over_tcp(backend, hosts, tmp_path, case):
    """socket_ifname: RINGREDUCE_SOCKET_IFNAME names each host's veth; routed_to_store: unset,
    the address that routes to the store is taken; forced_tcp: RINGREDUCE_TRANSPORT=tcp, so the
    ranks of one host talk over TCP too (on the host's veth address)."""
    if backend != "ringreduce":
        pytest.skip("gloo stand-in: no TCP transport to test")
    world = 4
    port = RDZV_PORT + ["socket_ifname", "routed_to_store", "forced_tcp"].index(case)
    extra = {"RINGREDUCE_TRANSPORT": "tcp"} if case == "forced_tcp" else {}
    codes, outputs, by_rank = run_job(hosts, tmp_path, use_ifname=case != "routed_to_store", port=port,
                                      extra_env=extra)
    ok = codes == [0, 0] and sorted(by_rank) == list(range(world)) and all(r["ok"] for r in by_rank.values())
    assert ok, _report(hosts, codes, outputs, by_rank, world)

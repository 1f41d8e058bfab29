"""The TCP transport from torch.distributed, on one host with RINGREDUCE_TRANSPORT=tcp.

Every collective the shared-memory path runs also runs over TCP: CI runs the collective and
point-to-point suites a second time with the variable set (the Makefile's test-py). Here: the
knobs (forced TCP, interface choice, sockets per pair), every dtype's all-reduce beside gloo, and
hostile connections to a rank's listener while a job runs (no effect on results, a log line).
The multi-host case (network namespaces, shared memory per host) is tests/test_netns.py.
"""

import errno
import os
import socket

import pytest

import harness
import reference

TCP = {"RINGREDUCE_TRANSPORT": "tcp", "RINGREDUCE_TCP_SOCKETS": "3", "RINGREDUCE_SLICE_BYTES": "4K"}


def _backend(ctx):
    import torch

    return ctx.group._get_backend(torch.device("cpu"))


def _rank_routes_and_sweep(ctx):
    import torch
    import torch.distributed as dist

    failures, digests = [], {}
    be = _backend(ctx)
    others = [p for p in range(ctx.world_size) if p != ctx.rank]
    if be.transport != "tcp" or sorted(be.tcp_peers()) != others or be.tcp_sockets != 3:
        failures.append(f"transport {be.transport}, TCP peers {be.tcp_peers()}, "
                        f"{be.tcp_sockets} sockets: expected tcp to {others} with 3")
    if not be.tcp_address().startswith("127.0.0.1:"):
        failures.append(f"listening on {be.tcp_address()}, expected the loopback address that "
                        "reaches the local store")
    for dtype_name in ("float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"):
        for op in reference.ops_for(dtype_name):
            if not reference.gloo_supports(dtype_name, op):
                continue
            for count in (0, 1, 1031, 70001):
                gens = [ctx.gen(dtype_name, op, count, rank=q) for q in range(ctx.world_size)]
                inputs = [reference.make_input(g, dtype_name, count, op, ctx.world_size) for g in gens]
                ours = inputs[ctx.rank].clone()
                dist.all_reduce(ours, op=reference.reduce_op(op), group=ctx.group)
                theirs = inputs[ctx.rank].clone()
                dist.all_reduce(theirs, op=reference.reduce_op(op), group=ctx.gloo)
                ref = reference.reference(inputs, dtype_name, op)
                scale = None if reference.exact_kind(dtype_name, op) else reference.float_scale(inputs, dtype_name, op)
                msg = reference.compare(ours, ref, dtype_name, op, scale)
                if msg:
                    failures.append(f"{dtype_name} {op} count {count}: {msg}")
                if not dtype_name.startswith(("float", "bfloat")) and not torch.equal(ours, theirs):
                    failures.append(f"{dtype_name} {op} count {count}: differs from gloo")
                digests[f"{dtype_name} {op} {count}"] = harness.digest(ours)
    return failures, digests


@pytest.mark.parametrize("world", [2, 3])
def test_forced_tcp_all_reduce_every_dtype_beside_gloo(ranks, backend, world):
    if backend != "ringreduce":
        pytest.skip("the TCP transport is ringreduce's")
    harness.check_results(ranks(world, env=TCP).run(_rank_routes_and_sweep, timeout=180))


def _rank_hostile_listener(ctx, log_path):
    """Rank 1 throws garbage, truncated hellos, a wrong secret and a half-open connection at rank
    0's listener between all-reduces; every result stays exact and rank 0 logs each drop."""
    import torch
    import torch.distributed as dist

    failures = []
    addr = [None]
    if ctx.rank == 0:
        addr[0] = _backend(ctx).tcp_address()
        # Rank 0's stderr (where the transport logs) goes to a file for the check below.
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        saved = os.dup(2)
        os.dup2(log, 2)
    dist.broadcast_object_list(addr, src=0, group=ctx.gloo)
    host, port = addr[0].rsplit(":", 1)

    def check(round_):
        count = 100003
        x = torch.arange(count, dtype=torch.int64) * (ctx.rank + 1) + round_
        dist.all_reduce(x, group=ctx.group)
        n = ctx.world_size
        want = torch.arange(count, dtype=torch.int64) * (n * (n + 1) // 2) + n * round_
        if not torch.equal(x, want):
            failures.append(f"round {round_}: all-reduce wrong after hostile connections")

    check(0)
    if ctx.rank == 1:
        gen = torch.Generator().manual_seed(ctx.seed)
        attacks = [
            torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=gen).numpy().tobytes(),
            b"RRHELLO1"[:5],  # truncated
            # A hello's layout with the right magic and version but a zero secret.
            (0x314F4C4C45485252).to_bytes(8, "little") + (1).to_bytes(4, "little")
            + (1).to_bytes(4, "little") + ctx.world_size.to_bytes(4, "little") + bytes(44),
        ]
        for payload in attacks:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                # The listener may read enough to judge the payload and close (with a reset,
                # our extra bytes unread) before we are done: sending, shutting down or
                # reading then fails, and the connection was dropped all the same.
                try:
                    s.sendall(payload)
                    s.shutdown(socket.SHUT_WR)
                    s.settimeout(10)
                    answer = s.recv(64)
                except (ConnectionResetError, BrokenPipeError):
                    answer = b""
                except OSError as e:
                    if e.errno != errno.ENOTCONN:
                        raise
                    answer = b""
                if answer:
                    failures.append(f"the listener answered {payload[:8]!r}...")
        with socket.create_connection((host, int(port)), timeout=10):
            pass  # connects and leaves without a word
    check(1)
    # Drops are logged by rank 0's I/O thread as they happen: all ranks go on with all-reduces
    # (which give it time, with no sleep) until rank 0 has read all four, or 200 rounds.
    text = ""
    for _ in range(200):
        check(2)
        done = [False]
        if ctx.rank == 0:
            with open(log_path) as f:
                text = f.read()
            done[0] = text.count("dropped a connection") >= 4
        dist.broadcast_object_list(done, src=0, group=ctx.gloo)
        if done[0]:
            break
    if ctx.rank == 0:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)
        for what in ("bad magic", "wrong job secret", "closed after"):
            if what not in text:
                failures.append(f"rank 0 logged no drop for '{what}': {text!r}")
    return failures, {}


def test_hostile_connections_do_not_disturb_a_job(ranks, backend, tmp_path):
    if backend != "ringreduce":
        pytest.skip("the TCP transport is ringreduce's")
    pool = ranks(2, env=TCP)
    harness.check_results(pool.run(_rank_hostile_listener, str(tmp_path / "rank0.log"), timeout=120))

"""Start N local ranks of a function and supervise them.

The parent owns the rendezvous: it creates the TCPStore server itself on port 0, so the kernel picks a
free port and no other process can take it between "find a port" and "bind it" (the race that
find-a-free-port-then-pass-it helpers have). Each child connects to that port as a client.

Failures are surfaced, not hidden: a rank that raises writes its traceback to a file the parent
prints, the other ranks are stopped (they would otherwise block forever in a collective with the
dead rank), and the parent returns a nonzero status. A deadline bounds the whole run.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

# Status returned when the deadline passes, as coreutils' `timeout` does.
TIMEOUT_STATUS = 124
# How long a stopped rank gets to exit after SIGTERM before SIGKILL.
_STOP_GRACE_S = 5.0


def launched_by_torchrun() -> bool:
    """True when the environment already describes this process's rank (torchrun, or any env:// launcher)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _child(
    fn: Callable[..., None],
    rank: int,
    world_size: int,
    port: int,
    timeout_s: float,
    err_path: str,
    args: tuple,
) -> None:
    # A rank stopped at the deadline (SIGTERM) prints where each of its threads was first.
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    try:
        store = dist.TCPStore(
            "127.0.0.1", port, world_size, is_master=False, timeout=timedelta(seconds=timeout_s)
        )
        fn(rank, world_size, store, *args)
    except Exception:
        # The parent prints this; raising instead would make multiprocessing print it a second time.
        with open(err_path, "w") as f:
            f.write(traceback.format_exc())
        sys.exit(1)
    # The rank's work is done and its groups destroyed. Leave without the interpreter's teardown:
    # torch 2.13's gloo sometimes aborts in its exit handlers ("terminate called without an active
    # exception", seen in 2-3 of 20 runs of a bare gloo DDP script), which would turn a finished
    # benchmark into a failed one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _stop(procs: list[multiprocessing.Process]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def spawn(
    fn: Callable[..., None],
    nproc: int,
    timeout_s: float,
    args: tuple[Any, ...] = (),
    name: str = "ringreduce",
) -> int:
    """Run ``fn(rank, nproc, store, *args)`` in ``nproc`` fresh processes; return an exit status.

    ``fn`` and ``args`` must be picklable (a module-level function). Returns 0 when every rank
    returned, the failing rank's status when one failed (its traceback printed to stderr), or
    ``TIMEOUT_STATUS`` when ``timeout_s`` passed first. ``name`` prefixes the messages.
    """
    # Fresh interpreters rather than fork: a forked child would inherit the parent's TCPStore server
    # thread state and torch's thread pools in an undefined state.
    ctx = multiprocessing.get_context("spawn")
    store = dist.TCPStore(
        "127.0.0.1", 0, nproc, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="ringreduce-launch-") as err_dir:
        err_paths = [os.path.join(err_dir, f"rank{r}.err") for r in range(nproc)]
        procs = [
            ctx.Process(
                target=_child,
                args=(fn, r, nproc, store.port, timeout_s, err_paths[r], args),
                name=f"rank{r}",
            )
            for r in range(nproc)
        ]
        try:
            for p in procs:
                p.start()
            running = dict(enumerate(procs))
            while running:
                left = deadline - time.monotonic()
                if left <= 0:
                    print(
                        f"{name}: timed out after {timeout_s:g} s; stopping ranks {sorted(running)} "
                        "(raise --timeout if the run is just slow)",
                        file=sys.stderr,
                    )
                    return TIMEOUT_STATUS
                ready = multiprocessing.connection.wait([p.sentinel for p in running.values()], timeout=left)
                for rank in sorted(r for r, p in running.items() if p.sentinel in ready):
                    p = running.pop(rank)
                    p.join()
                    if p.exitcode != 0:
                        return _report_failure(name, rank, p.exitcode, err_paths[rank], sorted(running))
            return 0
        finally:
            _stop(procs)


def _report_failure(name: str, rank: int, code: int, err_path: str, others: list[int]) -> int:
    stopped = f"; stopping ranks {others}" if others else ""
    print(f"{name}: rank {rank} {_describe_exit(code)}{stopped}", file=sys.stderr)
    if os.path.exists(err_path):
        with open(err_path) as f:
            print(f"--- traceback of rank {rank} ---\n{f.read()}", end="", file=sys.stderr)
    # Shell convention for a death by signal, so callers can still tell the two apart.
    return code if code > 0 else 128 - code

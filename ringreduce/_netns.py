"""Two "hosts" on one Linux machine, for the multi-host test and the TCP benchmark: two network
namespaces joined by a veth pair, and a command prefix that runs a process in one of them with IPC
and mount namespaces of its own and a private tmpfs on /dev/shm (so the hosts share no memory and
every byte between them crosses TCP). Needs root, iproute2 and util-linux's unshare.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass

SETUP_TIMEOUT = 30.0  # seconds for any one `ip` / `unshare` command


@dataclass
class Hosts:
    ns: list[str]
    veth: list[str]
    addr: list[str]


def cmd(*args, check=True, timeout=SETUP_TIMEOUT):
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def private_shm_prefix(ns: str) -> list[str]:
    """Command prefix running what follows inside network namespace `ns`, in a new IPC and
    mount namespace with a tmpfs of its own on /dev/shm (no shared memory with anyone)."""
    return ["ip", "netns", "exec", ns, "unshare", "--ipc", "--mount", "--propagation", "private",
            "sh", "-c", 'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh"]


def wait_both(procs, timeout: float, grace: float):
    """Waits for the two hosts' processes until `timeout` seconds; once one has failed, the other
    gets at most `grace` seconds more (its ranks may be stuck waiting for the failed host).
    Returns (exit codes, None for one still running; why the wait stopped short, or "")."""
    deadline = time.monotonic() + timeout
    codes: list = [None] * len(procs)
    why = f"timed out after {timeout:.0f}s"
    while None in codes and time.monotonic() < deadline:
        for k, p in enumerate(procs):
            if codes[k] is None:
                try:
                    codes[k] = p.wait(timeout=max(0.01, min(0.5, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    pass
        if None in codes and any(c not in (None, 0) for c in codes) and deadline > time.monotonic() + grace:
            deadline = time.monotonic() + grace
            why = f"killed {grace:.0f}s after the other host's process failed"
    return codes, why if None in codes else ""


def stop_process_group(p: subprocess.Popen):
    """Kills a host's launcher started with start_new_session, and everything under it, unless it
    has exited already."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=30)


def kill_namespace_processes(ns: str):
    p = cmd("ip", "netns", "pids", ns, check=False)
    for pid in p.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def make_hosts(tag: str, subnet: int) -> Hosts:
    """Two namespaces `rr<tag>a`/`rr<tag>b` joined by veth `rrv<tag>a` <-> `rrv<tag>b`,
    10.213.<subnet>.1/24 and .2/24. Raises RuntimeError (after undoing what it made) when a
    step fails."""
    h = Hosts(ns=[f"rr{tag}a", f"rr{tag}b"], veth=[f"rrv{tag}a", f"rrv{tag}b"],
              addr=[f"10.213.{subnet}.1", f"10.213.{subnet}.2"])
    try:
        for ns in h.ns:
            cmd("ip", "netns", "add", ns)
        cmd("ip", "link", "add", h.veth[0], "type", "veth", "peer", "name", h.veth[1])
        for ns, veth, addr in zip(h.ns, h.veth, h.addr):
            cmd("ip", "link", "set", veth, "netns", ns)
            cmd("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            cmd("ip", "-n", ns, "link", "set", "lo", "up")
            cmd("ip", "-n", ns, "link", "set", veth, "up")
    except BaseException:
        destroy_hosts(h)
        raise
    return h


def destroy_hosts(h: Hosts):
    for ns in h.ns:
        kill_namespace_processes(ns)
        cmd("ip", "netns", "del", ns, check=False)
    # Normally gone with its namespace; left behind only if moving it failed.
    cmd("ip", "link", "del", h.veth[0], check=False)

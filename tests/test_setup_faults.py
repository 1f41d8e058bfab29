"""Faults in a group's set-up and its shared memory: a /dev/shm of a container's default size, one
too small to hold the group, a rank killed at each point of set-up, and a job restarted on the
same store after a rank died inside init_process_group.

As in test_faults.py, each case starts its own ranks as plain processes, because a rank is meant
to die here; every rank writes what happened to a JSON file, and deadlines are everywhere.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


SMALL_SHM_WORKER = r'''
import json, os, sys, time
from datetime import timedelta
import torch.distributed as dist
import ringreduce  # noqa: F401
rank = int(os.environ["RANK"])
t0 = time.time()
res = {"rank": rank}
try:
    if os.environ.get("INIT_FILE"):  # ranks in network namespaces of their own reach no TCP store
        dist.init_process_group("ringreduce", init_method="file://" + os.environ["INIT_FILE"], rank=rank,
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=60))
    else:
        dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
    res["error"] = None
    mib = int(os.environ.get("ALLREDUCE_MIB", "0"))
    if mib:
        import torch
        t = torch.full((mib << 18,), float(rank + 1))
        dist.all_reduce(t)
        world = dist.get_world_size()
        res["sum_ok"] = bool((t == float(world * (world + 1) // 2)).all())
        be = dist.group.WORLD._get_backend(torch.device("cpu"))
        res["segments"] = be.segments
        res["tcp_peers"] = list(be.tcp_peers())
        # What the group's segments take, outside /dev/shm (docs/results.md has the figures): this
        # rank holds its own and every peer's it mapped, each counted once.
        seen = {}
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:"):
                    st = os.fstat(int(fd))
                    seen[(st.st_dev, st.st_ino)] = st.st_size
            except OSError:
                pass
        res["memfd_bytes"] = sum(seen.values())
        dist.barrier()
except Exception as e:
    res["error"] = str(e)
res["t"] = time.time() - t0
# A file per rank: the ranks run in the background of one shell, and lines they print at the same
# moment can run into each other.
with open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w") as f:
    json.dump(res, f)
'''


def _can_unshare_mount():
    try:
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
                              capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _small_dev_shm(tmp_path, world, shm_size, wrap="", extra_env=None, timeout=120):
    """Runs SMALL_SHM_WORKER's ranks in a mount namespace of the test's own with a tmpfs of
    `shm_size` on /dev/shm, each under `wrap`; returns (results by rank, what the shell printed,
    the names left in /dev/shm)."""
    port = harness.free_port()
    script = tmp_path / "worker.py"
    script.write_text(SMALL_SHM_WORKER)
    launch = " ".join(
        f"RANK={r} WORLD_SIZE={world} MASTER_ADDR=127.0.0.1 MASTER_PORT={port} "
        f"{wrap} {sys.executable} {script} {tmp_path} & " for r in range(world))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **(extra_env or {}))
    env.pop("RINGREDUCE_TRANSPORT", None)
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs -o size={shm_size} tmpfs /dev/shm && {launch} wait; echo LEFT: $(ls /dev/shm)"],
        capture_output=True, text=True, timeout=timeout, env=env)
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    left = [x.strip() for x in out.stdout.splitlines() if x.startswith("LEFT:")]
    return results, out.stdout + out.stderr[-3000:], left


@pytest.mark.parametrize("world", [2, 4, 8])
def test_a_docker_sized_dev_shm_does_not_limit_the_group(tmp_path, backend, world):
    """Docker's default /dev/shm is 64 MB, less than the segments of 4 or 8 ranks that all-reduce
    64 MiB. Segments without a name (memfd) do not live there: every rank sets up, the all-reduce
    is right, and nothing is ever linked in /dev/shm."""
    if backend != "ringreduce":
        pytest.skip("ringreduce's shared-memory set-up")
    if not _can_unshare_mount():
        pytest.skip("`unshare --mount` and a tmpfs mount are not permitted here (needs root)")
    results, why, left = _small_dev_shm(tmp_path, world, "64m", extra_env={"ALLREDUCE_MIB": "64"},
                                        timeout=300)
    assert len(results) == world, why
    for res in results:
        assert res["error"] is None and res.get("sum_ok"), why
        assert res["segments"] == "memfd", why
    assert left == ["LEFT:"], why


def test_ranks_in_containers_of_their_own_share_memory_without_dev_shm(tmp_path, backend):
    """A container per rank, as in a Kubernetes pod: each rank in a mount namespace of its own with
    a private 1 MB /dev/shm (too small for any segment, and shared with no one), all in one network
    namespace. The segments are memfds handed over through an abstract Unix socket: the ranks talk
    over shared memory, not TCP, and all-reduce 64 MiB."""
    if backend != "ringreduce":
        pytest.skip("ringreduce's shared-memory set-up")
    if not _can_unshare_mount():
        pytest.skip("`unshare --mount` and a tmpfs mount are not permitted here (needs root)")
    world = 3
    port = harness.free_port()
    script = tmp_path / "worker.py"
    script.write_text(SMALL_SHM_WORKER)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               ALLREDUCE_MIB="64", WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.pop("RINGREDUCE_TRANSPORT", None)
    procs = [subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "$0" "$@"', sys.executable, str(script), str(tmp_path)],
        env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)]
    outputs = harness.outputs_or_fail(procs, 240, "a rank in a container of its own hung")
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    why = json.dumps(results) + "".join(f"\n--- rank {r} ---\n{o[-2000:]}" for r, o in enumerate(outputs))
    assert len(results) == world, why
    for res in results:
        assert res["error"] is None and res.get("sum_ok"), why
        assert res["segments"] == "memfd" and res["tcp_peers"] == [], why


def test_a_dev_shm_too_small_fails_every_rank_at_once_with_the_size_and_the_fix(tmp_path, backend):
    """Ranks of one machine in network namespaces of their own (a container per rank, sharing
    /dev/shm) use named segments in /dev/shm. Here a 20 MB tmpfs on /dev/shm, in a mount namespace
    of the test's own, each rank in a PID and network namespace of its own (a file store between
    them): two ranks' segments fit, the third's does not. Every rank must fail within a second or
    two (the store's timeout is 60 s), say how much is needed and how to get it, and leave nothing
    in /dev/shm."""
    if backend != "ringreduce":
        pytest.skip("ringreduce's shared-memory set-up")
    if not _can_unshare_mount():
        pytest.skip("`unshare --mount` and a tmpfs mount are not permitted here (needs root)")
    if not harness.can_unshare_pid():
        pytest.skip("`unshare --pid --fork` is not permitted here (needs root or user namespaces)")
    world = 3
    results, why, left = _small_dev_shm(tmp_path, world, "20m", wrap="unshare --net --pid --fork",
                                        extra_env={"INIT_FILE": str(tmp_path / "store")})
    assert len(results) == world, why
    for res in results:
        err = res["error"]
        assert err is not None, why
        assert "cannot reserve" in err and "MiB" in err and "/dev/shm holds" in err, why
        assert "--shm-size" in err and "RINGREDUCE_TRANSPORT=tcp" in err, why
        assert res["t"] < 5, why
    # Ranks that reserve at the same moment can all run out of room (each holds part of it when
    # the tmpfs fills up); a rank that did reserve its own is told which rank failed.
    for res in results:
        if f"rank {res['rank']} cannot reserve" not in res["error"]:
            assert any(f"rank {r} failed" in res["error"] for r in range(world)), why
    assert left == ["LEFT:"], why


RESTART_WORKER = r'''
import json, os, sys
from datetime import timedelta
import torch
import torch.distributed as dist
import ringreduce  # noqa: F401

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
# The launcher's store, which outlives an attempt (as torchrun's agent's does).
store = dist.TCPStore("127.0.0.1", int(os.environ["STORE_PORT"]), world, is_master=False,
                      timeout=timedelta(seconds=20))
dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world,
                        timeout=timedelta(seconds=20))
t = torch.full((1000,), float(rank + 1))
dist.all_reduce(t)
print(json.dumps({"rank": rank, "sum": t[0].item()}), flush=True)
dist.barrier()
dist.destroy_process_group()
'''


def _restart_env(world, server):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHELASTIC_", "RINGREDUCE_FAILPOINT"))}
    env.update(WORLD_SIZE=str(world), STORE_PORT=str(server.port),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return env


def _launcher_store(world):
    """A launcher's TCPStore, which outlives each attempt (the caller keeps it referenced), and
    the environment of its ranks."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    return server, _restart_env(world, server)


def _start_restart_rank(env, rank, extra=None):
    return subprocess.Popen([sys.executable, "-c", RESTART_WORKER],
                            env=dict(env, RANK=str(rank), **(extra or {})),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _restarted_job_runs(env, world):
    """One attempt of every rank on the launcher's store; it must set up and all-reduce."""
    procs = [_start_restart_rank(env, r) for r in range(world)]
    outputs = harness.outputs_or_fail(procs, 90, "the restarted job hung in set-up on the reused store")
    why = "\n".join(f"--- rank {r} ---\n{o[-2000:]}" for r, o in enumerate(outputs))
    for p, out in zip(procs, outputs):
        assert p.returncode == 0, why
        line = [ln for ln in out.splitlines() if ln.startswith("{")]
        assert line and json.loads(line[-1])["sum"] == float(sum(range(1, world + 1))), why


@pytest.mark.parametrize("how", ["SIGKILL at the start of set-up", "SIGTERM inside set-up"])
def test_rank0_dies_in_set_up_and_the_job_restarts_twice_on_the_same_store(tmp_path, backend, how):
    """World 2 on a launcher's TCPStore, no torchrun variables: rank 0 dies inside
    init_process_group (killed by a failpoint before it wrote anything, or terminated from outside
    while it waits there for rank 1, which never came), then the job is restarted on the same
    store twice in a row: both attempts set up and all-reduce, and nothing is left in /dev/shm."""
    if backend != "ringreduce":
        pytest.skip("ringreduce's set-up")
    world = 2
    server, env = _launcher_store(world)
    before = harness.shm_entries()
    if how.startswith("SIGKILL"):
        first = [_start_restart_rank(env, r, {"RINGREDUCE_FAILPOINT": "setup.start:0"} if r == 0 else None)
                 for r in range(world)]
        first[0].wait(timeout=120)
        time.sleep(1.0)  # sleep-ok: rank 1 gets into set-up, which shows nowhere outside it
        first[1].kill()
        first[1].wait()
    else:
        lone = _start_restart_rank(env, 0)
        time.sleep(8.0)  # sleep-ok: it imports torch, then waits in set-up for rank 1 (unseen)
        assert lone.poll() is None, lone.communicate()[0][-2000:]
        lone.send_signal(signal.SIGTERM)
        lone.wait(timeout=60)
    _restarted_job_runs(env, world)
    _restarted_job_runs(env, world)
    assert harness.shm_entries() - before == set()


@pytest.mark.parametrize("point", ["setup.agreed", "setup.segment", "setup.links", "setup.p2p_links"])
def test_a_rank_killed_at_any_point_of_set_up_leaves_nothing_and_the_job_restarts(tmp_path, backend, point):
    """World 2 on a launcher's store: rank 1 is killed (SIGKILL) at a point of its set-up: the knobs
    agreed; its segment made and published, no peer has mapped it; the collectives' transports up;
    the point-to-point ones up too. The launcher then ends rank 0. Nothing of the dead attempt is
    left in /dev/shm, before any later group could sweep it (the segments have no name: with named
    ones, a death at setup.segment would leave one), and the job restarts on the same store."""
    if backend != "ringreduce":
        pytest.skip("ringreduce's set-up")
    world = 2
    server, env = _launcher_store(world)
    before = harness.shm_entries()
    first = [_start_restart_rank(env, r, {"RINGREDUCE_FAILPOINT": f"{point}:1"} if r == 1 else None)
             for r in range(world)]
    try:
        out1 = first[1].communicate(timeout=120)[0]
    finally:
        for p in first:
            p.kill()
    out0 = first[0].communicate()[0]
    why = f"--- rank 0 ---\n{out0[-2000:]}\n--- rank 1 ---\n{out1[-2000:]}"
    assert first[1].returncode == -signal.SIGKILL, f"rank 1 did not die at {point}\n{why}"
    assert harness.shm_entries() - before == set(), why
    _restarted_job_runs(env, world)
    assert harness.shm_entries() - before == set()


def test_a_job_restarted_on_the_same_store_after_a_rank_died_in_set_up_runs(tmp_path, backend):
    """A launcher that keeps its store across attempts (torchrun's agent does; so may others,
    without torchrun's TORCHELASTIC_RESTART_COUNT): attempt 1 loses a rank at the very start of
    the group's set-up, before it has written anything, and the launcher kills the others; attempt 2
    on the same store must set the group up and run, not wait for keys of the dead attempt."""
    if backend != "ringreduce":
        pytest.skip("ringreduce's set-up")
    world = 3
    server, env = _launcher_store(world)
    # Attempt 1: rank 2 dies at the start of set-up; the others get into theirs, then the launcher
    # ends them.
    first = [_start_restart_rank(env, r, {"RINGREDUCE_FAILPOINT": "setup.start:2"} if r == 2 else None)
             for r in range(world)]
    first[2].wait(timeout=120)
    time.sleep(2.0)  # sleep-ok: ranks 0 and 1 get into set-up, which shows nowhere outside it
    for p in first[:2]:
        p.kill()
        p.wait()
    _restarted_job_runs(env, world)

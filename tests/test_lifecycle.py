"""A process group's life: set up, used, destroyed, and set up again in the same processes on the
same store, leaving no threads and no /dev/shm segments behind; shutdown and abort."""

import os
import tempfile

import pytest
import torch.multiprocessing as mp


def _threads():
    return len(os.listdir("/proc/self/task"))


def _segments():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("ringreduce-"))


def _spawn(fn, world):
    """Runs fn(rank, world, store_path, results) on `world` fresh processes; returns what they put
    in `results`, sorted by rank. A rank that dies fails the test; none outlives it."""
    return _spawn_fn(fn, world)


def _spawn_fn(fn, world, *extra):
    """_spawn, with `extra` arguments after fn's usual ones."""
    with tempfile.TemporaryDirectory() as d:
        results = mp.get_context("spawn").Queue()
        procs = mp.start_processes(fn, args=(world, os.path.join(d, "store"), results) + extra,
                                   nprocs=world, start_method="spawn", join=False)
        try:
            while not procs.join(timeout=120):
                pass
        finally:
            for p in procs.processes:
                if p.is_alive():
                    p.kill()
        return sorted(results.get(timeout=10) for _ in range(world))


def _rank_reinit(rank, world, path, results):
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.FileStore(path, world)
    threads = []
    for round_ in range(3):
        dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        t = torch.full((1000,), float(rank + round_))
        dist.all_reduce(t)
        assert t[0].item() == sum(r + round_ for r in range(world)), (round_, t[0].item())
        sub = dist.new_group(backend="ringreduce")
        dist.all_reduce(t, group=sub)
        dist.destroy_process_group()
        threads.append(_threads())
    # monitored_barrier is a gloo-only collective in torch; on ringreduce torch refuses it itself.
    dist.init_process_group("ringreduce", store=store, rank=rank, world_size=world)
    try:
        dist.monitored_barrier()
        refused = None
    except ValueError as e:
        refused = str(e)
    # shutdown then abort on one group, and ops afterwards fail with a message instead of hanging.
    g = dist.new_group(backend="ringreduce")
    backend = g._get_backend(torch.device("cpu"))
    backend.shutdown()
    try:
        dist.all_reduce(torch.ones(3), group=g)
        after_shutdown = None
    except RuntimeError as e:
        after_shutdown = str(e)
    dist.destroy_process_group()
    results.put((rank, threads, refused, after_shutdown))


@pytest.mark.parametrize("world", [2, 3])
def test_destroy_and_init_again_leaves_nothing_behind(world):
    before = _segments()
    got = _spawn(_rank_reinit, world)
    for rank, threads, refused, after_shutdown in got:
        # Each incarnation's progress thread is gone once it is destroyed: no growth per round.
        assert threads[0] == threads[1] == threads[2], f"rank {rank}: threads per round {threads}"
        assert refused and "GLOO" in refused, f"rank {rank}: {refused!r}"
        assert after_shutdown and "shut down" in after_shutdown, f"rank {rank}: {after_shutdown!r}"
    assert _segments() == before, f"segments left in /dev/shm: {set(_segments()) - set(before)}"


def _rank_destroy_in_callback(rank, world, path, results):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("ringreduce", store=dist.FileStore(path, world), rank=rank,
                            world_size=world)
    # The only reference to the group is in `holder`, so the callback's destroy_process_group
    # drops the last one, on the group's own progress thread.
    holder = [dist.new_group(backend="ringreduce")]
    t = torch.ones(1000)
    fut = dist.all_reduce(t, group=holder[0], async_op=True).get_future()
    fut.then(lambda f: dist.destroy_process_group(holder.pop())).wait()
    x = torch.ones(3)
    dist.all_reduce(x)  # the default group goes on working
    dist.destroy_process_group()
    results.put((rank, t[0].item(), x[0].item()))


def test_group_destroyed_from_its_own_callback():
    world = 2
    got = _spawn(_rank_destroy_in_callback, world)
    assert got == [(r, float(world), float(world)) for r in range(world)], got


def _rank_end_from_thread(rank, world, path, results, how, transport):
    import datetime
    import threading
    import time

    import torch
    import torch.distributed as dist

    os.environ["RINGREDUCE_TRANSPORT"] = transport
    torch.set_num_threads(1)
    dist.init_process_group("ringreduce", store=dist.FileStore(path, world), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    g = dist.new_group(backend="ringreduce", timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(10), group=g)
    out = {"rank": rank}
    if rank == 0:
        # Rank 1 never joins this all-reduce; another thread ends it well inside the 60 s timeout.
        backend = g._get_backend(torch.device("cpu"))
        ended = []

        def end_it():
            threading.Event().wait(0.5)  # the op is waiting for rank 1 by then
            ended.append(time.monotonic())
            getattr(backend, how)()

        t = threading.Thread(target=end_it)
        t.start()
        try:
            dist.all_reduce(torch.ones(1 << 20), group=g)
            out["error"] = None
        except RuntimeError as e:
            out["error"] = str(e)
            out["after_end_s"] = time.monotonic() - ended[0]
        t.join()
    else:
        # Rank 1 learns of it at its next op on the group, which fails at once.
        dist.barrier()
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(10), group=g)
            out["error"] = None
        except RuntimeError as e:
            out["error"] = str(e)
            out["after_end_s"] = time.monotonic() - start
    if rank == 0:
        dist.barrier()
    # The default group is untouched.
    x = torch.full((4,), float(rank))
    dist.all_reduce(x)
    out["world_ok"] = x.tolist() == [float(sum(range(world)))] * 4
    dist.destroy_process_group()
    results.put((rank, out))


@pytest.mark.parametrize("transport", ["auto", "tcp"])
@pytest.mark.parametrize("how", ["abort", "shutdown"])
def test_abort_or_shutdown_from_another_thread_ends_an_op_in_flight(how, transport):
    got = dict(_spawn_fn(_rank_end_from_thread, 2, how, transport))
    zero, one = got[0], got[1]
    assert zero["error"] and "allreduce #1" in zero["error"], zero
    assert ("aborted" in zero["error"] if how == "abort" else "shut the process group down" in
            zero["error"]), zero
    assert zero["after_end_s"] < 5, zero  # the op's timeout is 60 s
    assert one["error"] and "aborted" in one["error"] and "rank 0" in one["error"], one
    assert one["after_end_s"] < 5, one
    assert zero["world_ok"] and one["world_ok"], got

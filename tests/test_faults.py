"""Faults: a rank killed mid all-reduce, a rank stopped for a while, a rank that never
comes; over shared memory and over TCP.

Each case starts its own ranks as plain processes (env:// rendezvous on a TCPStore) because a
rank is meant to die or hang here, which the shared pools of the other tests do not survive.
Every rank writes what happened to a JSON file; the test reads them. Deadlines everywhere: the
processes are killed if a case overruns, and the case fails saying so.
"""

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import redirect_stdout

import pytest

import harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

WORKER = r'''
import json, os, signal, sys, threading, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ringreduce  # noqa: F401  (registers the backend)

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
case, out = os.environ["FAULT_CASE"], os.environ["FAULT_OUT"]
timeout_s = float(os.environ.get(f"FAULT_TIMEOUT_RANK{rank}", os.environ["FAULT_TIMEOUT"]))
dist.init_process_group("ringreduce", timeout=timedelta(seconds=timeout_s))
res = {"rank": rank, "pid": os.getpid()}
x = torch.ones(1 << 16)
dist.all_reduce(x)  # every link is up before the fault
victim = world - 1
count = 48 << 20  # 192 MB of float32: the all-reduce takes a while
if case == "kill" and rank == victim:
    # All-reduces back to back, and a kill a moment in: it lands in the middle of one.
    def die():
        threading.Event().wait(0.3)
        with open(os.path.join(out, "death"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=die, daemon=True).start()
    big = torch.full((count // 6,), float(rank + 1))
    for _ in range(100000):
        dist.all_reduce(big)
    res["error"] = "the victim finished its all-reduces before it was killed"
elif case == "kill":
    big = torch.full((count // 6,), float(rank + 1))
    try:
        for _ in range(100000):
            dist.all_reduce(big)
        res["error"] = "no all-reduce failed"
    except Exception as e:  # what the test checks
        res["error"] = str(e)
        res["t_error"] = time.time()
elif case == "absent" and rank == victim:
    res["skipped"] = True  # never calls the all-reduce; waits for the others to give up
    for _ in range(600):
        if all(os.path.exists(os.path.join(out, f"rank{r}.json")) for r in range(world - 1)):
            break
        threading.Event().wait(0.1)
    # Its flight recorder is dumped when it finds the group aborted, though it is in no op.
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    mine = os.path.join(be.flight_dir, f"ringreduce_flight_{be.flight_group}_rank{rank}.json")
    for _ in range(100):
        if os.path.exists(mine):
            break
        threading.Event().wait(0.1)
    res["dumped"] = os.path.exists(mine)
elif case == "stop_bcast":
    # Small broadcasts from rank 0 back to back: the root finishes its part of each and goes on
    # to the next, so it waits one op ahead of the rank that waits for the stopped one.
    small = torch.ones(1024)
    try:
        for i in range(10 ** 7):
            if i == 100:
                open(os.path.join(out, f"started{rank}"), "w").close()
            dist.broadcast(small, src=0)
        res["error"] = "no broadcast failed"
    except Exception as e:  # what the test checks
        res["error"] = str(e)
        res["t_error"] = time.time()
elif case == "stop_p2p":
    # Sends and receives around the ring, each rank to the next: the stopped rank is in the middle
    # of a pair when it stops.
    peer_to, peer_from = (rank + 1) % world, (rank - 1) % world
    try:
        for i in range(400):
            send = torch.full((count // 16,), float(rank + i))
            recv = torch.empty(count // 16)
            if i == 1:
                open(os.path.join(out, f"started{rank}"), "w").close()
            works = [dist.isend(send, peer_to), dist.irecv(recv, peer_from)]
            for w in works:
                w.wait()
        res["error"] = "no send or receive failed"
    except Exception as e:  # what the test checks
        res["error"] = str(e)
        res["t_error"] = time.time()
elif case == "ops":
    # One phase per op of FAULT_OPS, each on a group of its own (the one before is aborted): the
    # ranks run the op back to back until it fails. Rank 1 is stopped in each phase, from outside
    # (FAULT_STOP=outside: wherever it happens to be) or by itself with an op issued and not yet
    # waited for (FAULT_STOP=self); it is resumed once both survivors have written their result.
    # FAULT_OP_TIMEOUTS: {op: {rank: seconds}} where a rank's timeout in that op differs.
    stop_self = os.environ["FAULT_STOP"] == "self"
    per_op = json.loads(os.environ.get("FAULT_OP_TIMEOUTS", "{}"))
    n = 1024

    def step(op, pg, async_op=False):
        if op == "send_recv_chain":
            # Rank 1 sends to rank 2, which passes it on to rank 0: with rank 1 stopped, rank 2
            # waits for rank 1 and rank 0 for rank 2, a chain of waits (rank 0 never talks to 1).
            buf = torch.empty(n)
            if rank == 1:
                dist.send(torch.zeros(n), 2, group=pg)
            elif rank == 2:
                dist.recv(buf, 1, group=pg)
                dist.send(buf, 0, group=pg)
            else:
                dist.recv(buf, 2, group=pg)
            return []
        if op == "send_recv":
            # Rank 1 exchanges with each of the others, and they with it only. (Not around the
            # ring: send/recv has no chain of waits to follow. A survivor that has run one pair
            # ahead of the other, whose send to it waits for rank 1, names that survivor.)
            peers = [r for r in range(world) if r != rank] if rank == 1 else [1]
            works = []
            for p in peers:
                works += [dist.isend(torch.full((n,), float(rank)), p, group=pg),
                          dist.irecv(torch.empty(n), p, group=pg)]
            if async_op:
                return works
            for w in works:
                w.wait()
            return []
        x = torch.full((n,), float(rank + 1))
        if op == "all_reduce":
            w = dist.all_reduce(x, group=pg, async_op=async_op)
        elif op == "broadcast":
            w = dist.broadcast(x, src=0, group=pg, async_op=async_op)
        elif op == "reduce":
            w = dist.reduce(x, dst=0, group=pg, async_op=async_op)
        elif op == "all_gather":
            w = dist.all_gather([torch.empty(n) for _ in range(world)], x, group=pg, async_op=async_op)
        elif op == "all_gather_into_tensor":
            w = dist.all_gather_into_tensor(torch.empty(world * n), x, group=pg, async_op=async_op)
        elif op == "reduce_scatter":
            w = dist.reduce_scatter(torch.empty(n), [x.clone() for _ in range(world)], group=pg,
                                    async_op=async_op)
        elif op == "reduce_scatter_tensor":
            w = dist.reduce_scatter_tensor(torch.empty(n), torch.cat([x] * world), group=pg,
                                           async_op=async_op)
        elif op == "all_to_all_single":
            w = dist.all_to_all_single(torch.empty(world * n), torch.cat([x] * world), group=pg,
                                       async_op=async_op)
        elif op == "all_to_all":
            w = dist.all_to_all([torch.empty(n) for _ in range(world)], [x.clone() for _ in range(world)],
                                group=pg, async_op=async_op)
        elif op == "gather":
            w = dist.gather(x, [torch.empty(n) for _ in range(world)] if rank == 0 else None, dst=0,
                            group=pg, async_op=async_op)
        elif op == "scatter":
            w = dist.scatter(torch.empty(n), [x.clone() for _ in range(world)] if rank == 0 else None,
                             src=0, group=pg, async_op=async_op)
        elif op == "barrier":
            w = dist.barrier(group=pg, async_op=async_op)
        else:
            raise ValueError(f"no such op {op!r}")
        return [w] if async_op else []

    for k, op in enumerate(os.environ["FAULT_OPS"].split(",")):
        t = float(per_op.get(op, {}).get(str(rank), os.environ["FAULT_PHASE_TIMEOUT"]))
        # The ranks meet on the default group (its timeout is long) before each phase: the group's
        # own set-up is bounded by the phase's short timeout, and rank 1, resumed late, may reach it
        # seconds after the survivors.
        dist.barrier()
        pg = dist.new_group(backend="ringreduce", timeout=timedelta(seconds=t))
        phase = {"rank": rank, "op": op}
        try:
            for i in range(10 ** 7):
                if rank == 1 and i == 20:
                    if stop_self:
                        # The op is issued, its peers are in it, and this rank stops before it
                        # waits for it: the op is in flight here when the rank resumes.
                        works = step(op, pg, async_op=True)
                        os.kill(os.getpid(), signal.SIGSTOP)
                        phase["in_flight"] = "failed"
                        for w in works:
                            w.wait()
                        phase["in_flight"] = "completed"
                        continue
                    open(os.path.join(out, f"started{k}"), "w").close()
                step(op, pg)
            phase["error"] = f"no {op} failed"
        except Exception as e:  # what the test checks
            phase["error"] = str(e)
            phase["t_error"] = time.time()
        with open(os.path.join(out, f"phase{k}_rank{rank}.json.tmp"), "w") as f:
            json.dump(phase, f)
        os.replace(os.path.join(out, f"phase{k}_rank{rank}.json.tmp"),
                   os.path.join(out, f"phase{k}_rank{rank}.json"))
    res["phases"] = k + 1
    # Nobody leaves before every rank has written its last phase: a survivor that exits would be
    # a second fault in the others' errors.
    for _ in range(2400):
        if all(os.path.exists(os.path.join(out, f"phase{k}_rank{r}.json")) for r in range(world)):
            break
        threading.Event().wait(0.05)
else:
    rounds = 12 if case == "stop" else 1
    try:
        for i in range(rounds):
            big = torch.full((count // 4 if case == "stop" else count,), float(rank + 1 + i))
            if i == 1:
                open(os.path.join(out, f"started{rank}"), "w").close()
            dist.all_reduce(big)
            want = float(sum(r + 1 + i for r in range(world)))
            if not bool((big == want).all()):
                res["wrong"] = f"round {i}: got {big[0].item()}, want {want}"
        res["ok"] = True
    except Exception as e:  # what the test checks
        res["error"] = str(e)
        res["t_error"] = time.time()
with open(os.path.join(out, f"rank{rank}.json.tmp"), "w") as f:
    json.dump(res, f)
os.replace(os.path.join(out, f"rank{rank}.json.tmp"), os.path.join(out, f"rank{rank}.json"))
sys.stdout.flush()
if case == "stop_p2p" and rank != 1:
    # The survivors keep their processes until the stopped rank has failed: it must learn of the
    # abort, not of their deaths.
    for _ in range(1200):
        if os.path.exists(os.path.join(out, "rank1.json")):
            break
        threading.Event().wait(0.05)
os._exit(0)  # the group may be aborted: no teardown
'''


def _launch(tmp_path, world, case, transport, timeout_s, on_started=None, wrap=None, timeouts=None,
            env_of=None):
    """`timeouts`: {rank: seconds} for ranks whose group timeout differs from `timeout_s`;
    `env_of`: {rank: {name: value}} set in that rank's environment only."""
    port = harness.free_port()
    procs = []
    before = harness.shm_entries()
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), FAULT_CASE=case, FAULT_OUT=str(tmp_path),
                   FAULT_TIMEOUT=str(timeout_s), RINGREDUCE_TRANSPORT=transport,
                   RINGREDUCE_FLIGHT_DIR=str(tmp_path / "flight"),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if rank in (timeouts or {}):
            env[f"FAULT_TIMEOUT_RANK{rank}"] = str(timeouts[rank])
        env.update((env_of or {}).get(rank, {}))
        argv = (wrap or {}).get(rank, []) + [sys.executable, "-c", WORKER]
        procs.append(subprocess.Popen(argv, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    if on_started is not None:
        on_started(procs)
    outputs = []
    deadline = time.monotonic() + timeout_s + 120
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"{case} over {transport}: a rank hung past the deadline")
    results = {}
    for rank in range(world):
        path = tmp_path / f"rank{rank}.json"
        if path.exists():
            results[rank] = json.loads(path.read_text())
    leaked = harness.shm_entries() - before
    return results, outputs, leaked


def _stop_rank1(tmp_path, while_stopped):
    """An on_started for _launch: once rank 1 has written its "started" file, stop it (SIGSTOP),
    call while_stopped(), then resume it (SIGCONT)."""
    def stop_one(procs):
        started = tmp_path / "started1"
        for _ in range(1200):
            if started.exists():
                break
            threading.Event().wait(0.05)
        procs[1].send_signal(signal.SIGSTOP)
        while_stopped()
        procs[1].send_signal(signal.SIGCONT)
    return stop_one


def _explain(results, outputs):
    return "\n".join([json.dumps(results, indent=1)] + [f"--- rank {r} output ---\n{o[-3000:]}"
                                                        for r, o in enumerate(outputs)])


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_rank_killed_mid_all_reduce_fails_every_survivor_fast(tmp_path, backend, transport):
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    world, timeout_s = 3, 60
    results, outputs, leaked = _launch(tmp_path, world, "kill", transport, timeout_s)
    why = _explain(results, outputs)
    assert (tmp_path / "death").exists(), why
    died = float((tmp_path / "death").read_text())
    assert world - 1 not in results, why  # it never got to write
    for rank in range(world - 1):
        r = results.get(rank)
        assert r is not None and "error" in r, why
        err = r["error"]
        assert "allreduce #" in err and f"rank {world - 1}" in err, why
        assert "died" in err or "lost its connection" in err, why
        # Far inside the op's timeout: the death is noticed, not waited out.
        assert 0 <= r["t_error"] - died < 10, why
    assert not leaked, f"segments left in /dev/shm: {leaked}"
    print(f"{transport}: death to error: " + ", ".join(
        f"rank {r} {1e3 * (results[r]['t_error'] - died):.0f} ms" for r in range(world - 1)))


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_rank_stopped_for_a_while_still_gives_the_right_result(tmp_path, backend, transport):
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    world = 3

    # Less than the timeout: slow, not dead.
    stop_one = _stop_rank1(tmp_path, lambda: threading.Event().wait(1.5))

    results, outputs, leaked = _launch(tmp_path, world, "stop", transport, 30, on_started=stop_one)
    why = _explain(results, outputs)
    for rank in range(world):
        r = results.get(rank)
        assert r is not None and r.get("ok") and "wrong" not in r, why
    assert not leaked


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_rank_that_never_calls_is_named_by_the_timeout(tmp_path, backend, transport):
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    world = 3
    results, outputs, leaked = _launch(tmp_path, world, "absent", transport, 4)
    why = _explain(results, outputs)
    named = 0
    for rank in range(world - 1):
        r = results.get(rank)
        assert r is not None and "error" in r, why
        assert "allreduce #" in r["error"] and " Timed out " in r["error"], why
        named += f"rank {world - 1} has not arrived" in r["error"]
    # The rank that times out first follows the chain of waits to the absent rank (reading its
    # peers' segments over shared memory, asking them over TCP), and its abort tells the others.
    assert named == world - 1, why
    assert results.get(world - 1, {}).get("skipped"), why
    assert not leaked
    # Every rank dumped its flight recorder (the absent one when the others' abort reached it), and
    # the reader says who is missing what.
    assert results[world - 1].get("dumped"), why
    from ringreduce import flight
    out = io.StringIO()
    with redirect_stdout(out):
        rc = flight.main([str(tmp_path / "flight")])
    report = out.getvalue()
    assert rc == 1, report
    assert f"dumps from ranks {', '.join(map(str, range(world)))}" in report, report
    assert f"rank {world - 1} is missing op #1 allreduce [50331648] Float: the last op it issued " \
           "is #0" in report, report
    assert f"ranks that issued it: {', '.join(map(str, range(world - 1)))} failed" in report, report
    print(report)


P2P_WORKER = r'''
import json, os, signal, sys, time
from datetime import timedelta
import torch
import torch.distributed as dist
import ringreduce  # noqa: F401

rank = int(os.environ["RANK"])
out = os.environ["FAULT_OUT"]
dist.init_process_group("ringreduce", timeout=timedelta(seconds=60))
dist.barrier()
if rank == 1:
    with open(os.path.join(out, "death"), "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
res = {}
for what in ("recv", "send"):
    t = torch.zeros(100)
    try:
        (dist.recv if what == "recv" else dist.send)(t, 1)
        res[what] = "returned"
    except Exception as e:  # what the test checks
        res[what] = str(e)
    res["t_" + what] = time.time()
with open(os.path.join(out, "rank0.json"), "w") as f:
    json.dump(res, f)
os._exit(0)
'''


def test_send_and_recv_with_a_dead_peer_fail_within_a_second(tmp_path, backend):
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    port = harness.free_port()
    procs = [subprocess.Popen([sys.executable, "-c", P2P_WORKER], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=str(port), FAULT_OUT=str(tmp_path),
                                       PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
             for r in range(2)]
    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=150)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung")
    res = json.loads((tmp_path / "rank0.json").read_text())
    died = float((tmp_path / "death").read_text())
    why = json.dumps(res, indent=1) + "\n" + outputs[0][-2000:]
    for what in ("recv", "send"):
        assert "rank 1 is gone" in res[what] and "died" in res[what] and f"ringreduce {what}" in res[what], why
    # The timeout is 60 s: the death is noticed, not waited out.
    assert res["t_recv"] - died < 3, why
    assert res["t_send"] - res["t_recv"] < 3, why


def test_a_rank_in_another_pid_namespace_is_known_alive_and_its_death_noticed(tmp_path, backend):
    """One container per rank with a shared /dev/shm: the victim runs in a PID namespace of its
    own, where its pid means nothing to its peers (a shell is pid 1 there, so that the victim can
    be killed, and the victim pid 2, which in its peers' namespace is a kernel thread, alive). Its
    segments reach the peers through an abstract socket (the INFO line says memfd): none has a
    name, and its death is seen through its lock all the same."""
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    if not harness.can_unshare_pid():
        pytest.skip("`unshare --pid --fork` is not permitted here (needs root or user namespaces)")
    world = 3
    results, outputs, leaked = _launch(tmp_path, world, "kill", "auto", 30,
                                       wrap={world - 1: ["unshare", "--pid", "--fork", "sh", "-c",
                                                         '"$0" "$@"; exit $?']},
                                       env_of={0: {"RINGREDUCE_DEBUG": "INFO"}})
    why = _explain(results, outputs)
    # A peer in another PID namespace cannot open a memfd through /proc: it is handed the
    # descriptor through an abstract Unix socket, and no segment has a name (the INFO line says so).
    assert "segments: memfd" in outputs[0] and "segments: /dev/shm" not in outputs[0], why
    died = float((tmp_path / "death").read_text())
    for rank in range(world - 1):
        r = results.get(rank)
        assert r is not None and "died" in r.get("error", ""), why
        assert r["t_error"] - died < 10, why
    assert not leaked, f"segments left in /dev/shm: {leaked}"


def test_a_rank_stopped_past_the_timeout_is_named_as_stopped(tmp_path, backend):
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    world, timeout_s = 3, 4

    # Past the timeout: the others give up meanwhile.
    stop_one = _stop_rank1(tmp_path, lambda: threading.Event().wait(timeout_s + 4))

    results, outputs, leaked = _launch(tmp_path, world, "stop", "auto", timeout_s, on_started=stop_one)
    why = _explain(results, outputs)
    for rank in (0, 2):
        err = results.get(rank, {}).get("error", "")
        assert " Timed out " in err and "rank 1 is stopped" in err, why
        assert "did not issue the same ops" not in err, why
    assert "error" in results.get(1, {}), why  # it finds the group aborted when it goes on
    assert not leaked


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_the_timeout_follows_the_chain_of_waits_to_the_stopped_rank(tmp_path, backend, transport):
    """World 3, broadcasts from rank 0, rank 1 stopped: rank 2 waits for rank 1 in one broadcast
    while the root, one broadcast ahead, waits for rank 2. The root's timeout (rank 2's is longer,
    so the root's comes first) follows rank 2 back into the broadcast it is in and names rank 1,
    over TCP as over shared memory."""
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    world, timeout_s = 3, 4

    stop_one = _stop_rank1(tmp_path, lambda: threading.Event().wait(timeout_s + 4))

    results, outputs, leaked = _launch(tmp_path, world, "stop_bcast", transport, timeout_s,
                                       on_started=stop_one, timeouts={2: 3 * timeout_s})
    why = _explain(results, outputs)
    err = results.get(0, {}).get("error", "")
    assert err.startswith("ringreduce broadcast #") and " Timed out " in err, why
    # Over shared memory the stopped process is seen in /proc; over TCP it does not answer the
    # state query.
    assert "rank 1 is stopped" in err or "the state of rank 1 is unknown" in err, why
    assert "has not arrived" not in err, why
    assert "rank 1" in results.get(2, {}).get("error", ""), why
    assert not leaked


# Over shared memory only, as the resumed collectives below: make test's time is kept for the
# TCP pass of test_every_op_names_the_stopped_rank_in_every_survivors_error.
@pytest.mark.parametrize("transport", ["auto"])
def test_a_stopped_rank_resumed_in_send_recv_finds_the_group_aborted_at_once(tmp_path, backend,
                                                                            transport):
    """Its peers timed out waiting for it and aborted the group, keeping their processes: once
    resumed, the rank's pending send or receive fails with their reason at once, not at its own
    deadline, over shared memory as over TCP."""
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    world, timeout_s = 3, 6

    def stop_then_resume(procs):
        # Rank 1 stops itself (a failpoint) with part of a send's data out, so that its peers
        # are inside transfers with it; once both have failed, it is resumed.
        stat = f"/proc/{procs[1].pid}/stat"
        for _ in range(1200):
            with open(stat) as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    break
            threading.Event().wait(0.05)
        for _ in range(int((timeout_s + 30) / 0.1)):
            if all((tmp_path / f"rank{r}.json").exists() for r in (0, 2)):
                break
            threading.Event().wait(0.1)
        (tmp_path / "resumed").write_text(repr(time.time()))
        procs[1].send_signal(signal.SIGCONT)

    results, outputs, leaked = _launch(
        tmp_path, world, "stop_p2p", transport, timeout_s, on_started=stop_then_resume,
        env_of={1: {"RINGREDUCE_FAILPOINT": "p2p.send_data:1:3:stop"}})
    why = _explain(results, outputs)
    for rank in (0, 2):
        assert " Timed out " in results.get(rank, {}).get("error", ""), why
    resumed = float((tmp_path / "resumed").read_text())
    r1 = results.get(1, {})
    assert "aborted" in r1.get("error", ""), why
    # Its own deadline was timeout_s after its op began, long before the resume: the wait it
    # was in ends when it looks at the group, not at a second deadline.
    assert r1["t_error"] - resumed < timeout_s / 2, why
    assert not leaked



# Every collective the backend has, and send/recv; of torch's two forms of one op, one runs over
# shared memory and the other over TCP (both reach the same op of the backend). send_recv last: a
# stop between two of its pairs aborts nothing (the peers' unmatched requests fail alone), so the
# stopped rank, once resumed, waits out its own timeout there.
EVERY_OP = {
    "auto": ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
             "all_to_all_single", "gather", "scatter", "barrier", "send_recv"],
    "tcp": ["all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor",
            "all_to_all", "gather", "scatter", "barrier", "send_recv_chain", "send_recv"],
}


def _phases(tmp_path, ops, transport, stop, phase_timeout, op_timeouts):
    """Runs the "ops" case: world 3, a phase per op of `ops` on a group of its own, rank 1 stopped
    in each (stop="outside": by SIGSTOP from here once it has run the op 20 times; stop="self": it
    stops itself with the op issued) and resumed once ranks 0 and 2 have failed. Returns
    ({phase: {rank: result}}, {phase: when rank 1 was resumed}, why)."""
    world = 3
    resumed = {}

    def phase_done(k):
        return all((tmp_path / f"phase{k}_rank{r}.json").exists() for r in (0, 2))

    def stop_each(procs):
        for k in range(len(ops)):
            if stop == "outside":
                for _ in range(2400):
                    if (tmp_path / f"started{k}").exists() or procs[1].poll() is not None:
                        break
                    threading.Event().wait(0.05)
                procs[1].send_signal(signal.SIGSTOP)
            else:
                stat = f"/proc/{procs[1].pid}/stat"
                for _ in range(2400):
                    try:
                        with open(stat) as f:
                            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                                break
                    except OSError:
                        break
                    threading.Event().wait(0.05)
            for _ in range(1200):
                if phase_done(k) or procs[0].poll() is not None or procs[2].poll() is not None:
                    break
                threading.Event().wait(0.05)
            resumed[k] = time.time()
            procs[1].send_signal(signal.SIGCONT)
            for _ in range(1200):
                if (tmp_path / f"phase{k}_rank1.json").exists() or procs[1].poll() is not None:
                    break
                threading.Event().wait(0.05)

    env = {"FAULT_OPS": ",".join(ops), "FAULT_STOP": stop, "FAULT_PHASE_TIMEOUT": str(phase_timeout),
           "FAULT_OP_TIMEOUTS": json.dumps(op_timeouts)}
    # The default group's timeout (60 s) bounds the set-up of each phase's group, where the
    # survivors wait for the stopped rank to come back.
    results, outputs, leaked = _launch(tmp_path, world, "ops", transport, 60, on_started=stop_each,
                                       env_of={r: env for r in range(world)})
    phases = {}
    for k in range(len(ops)):
        phases[k] = {}
        for r in range(world):
            path = tmp_path / f"phase{k}_rank{r}.json"
            if path.exists():
                phases[k][r] = json.loads(path.read_text())
    why = _explain(results, outputs) + "\n" + json.dumps(phases, indent=1)
    assert not leaked, f"segments left in /dev/shm: {leaked}\n{why}"
    return phases, resumed, why


# Over TCP, where the chain is followed by asking peers their state; over shared memory the same
# code reads the peers' segments, and test_the_timeout_follows_the_chain_of_waits_to_the_stopped_rank
# and test_a_stopped_rank_past_the_timeout_is_named_as_stopped cover it there.
@pytest.mark.parametrize("transport", ["tcp"])
def test_every_op_names_the_stopped_rank_in_every_survivors_error(tmp_path, backend, transport):
    """World 3, rank 1 stopped (SIGSTOP, from outside, wherever it is) while the ranks run one op
    back to back; a phase per collective and one for send/recv. Every survivor's error names
    rank 1: directly when it waits for rank 1, or through the chain of waits when it waits for the
    other survivor (rank 0's timeout is short and rank 2's long in the collectives, so rank 0's
    comes first and follows the chain). In send_recv each survivor exchanges with rank 1 only; in
    send_recv_chain (TCP) rank 0 receives from rank 2, which receives from rank 1.
    A rank that runs is never blamed."""
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    ops = EVERY_OP[transport]
    timeouts = {op: {"0": 2, "2": 2} if op == "send_recv" else {"0": 2, "2": 9} for op in ops}
    # send_recv_chain (TCP only): rank 0 waits for rank 2, which waits for rank 1; rank 0's request
    # times out first and follows the chain (which takes up to 2 s) while rank 2 still waits. A
    # failed send/recv aborts nothing, so rank 1 is resumed only once rank 2's own request has
    # timed out, and may then post one more request that nobody matches: its short timeout keeps
    # the others from waiting long for it at the next phase.
    if "send_recv_chain" in timeouts:
        timeouts["send_recv_chain"] = {"0": 2, "1": 1, "2": 4}
    phases, _, why = _phases(tmp_path, ops, transport, "outside", 2, timeouts)
    wrong = []
    for k, op in enumerate(ops):
        for rank in (0, 2):
            err = phases[k].get(rank, {}).get("error", "")
            # What the error says of the cause: after the last "aborted: " where the group
            # or point-to-point was aborted by another rank's failure.
            cause = err.rsplit("aborted: ", 1)[-1]
            if op.startswith("send_recv"):
                # Its request to or from rank 1 timed out (alone, or aborting point-to-point when
                # rank 1 stopped inside a transfer), or the other survivor's abort came first.
                named = "rank 1" in cause and ("Timed out" in cause or "rank 1 stopped" in cause)
            else:
                # Over shared memory the stopped process is seen in /proc; over TCP it does not
                # answer the state query.
                named = "rank 1 is stopped" in cause or "the state of rank 1 is unknown" in cause
            blamed = [f"rank {r} {what}" for r in (0, 2)
                      for what in ("has not arrived", "makes no progress", "is already at op",
                                   "is gone", "died", "stopped")
                      if f"rank {r} {what}" in err] + \
                     [f"lost its connection to rank {r}" for r in (0, 2)
                      if f"lost its connection to rank {r}" in err]
            if not named or blamed:
                wrong.append(f"{op}: rank {rank}: {err or phases[k].get(rank)}")
    assert not wrong, "\n".join(wrong) + "\n" + why
    print("\n".join(f"{op}: rank 0: {phases[k][0]['error']}" for k, op in enumerate(ops)))


# The resumed rank's case runs every collective but the second form of an op that torch has in two.
RESUMED_OPS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
               "all_to_all_single", "gather", "scatter", "barrier"]


# Over shared memory: over TCP the abort arrives as a frame that the resumed rank may read only
# after its op has started, so that op can still complete and the next one fails (docs/faults.md).
@pytest.mark.parametrize("transport", ["auto"])
def test_a_stopped_rank_resumed_in_any_collective_finds_the_group_aborted_at_once(tmp_path, backend,
                                                                                 transport):
    """World 3, a phase per collective: rank 1 issues the op and stops itself (SIGSTOP) before it
    waits for it, so that the op is in flight on it; its peers, in the op, time out and abort the
    group, and keep their processes. Resumed, rank 1 fails at once with their reason, well inside
    its own timeout (send/recv: test_a_stopped_rank_resumed_in_send_recv_...)."""
    if backend != "ringreduce":
        pytest.skip("faults of ringreduce's transports")
    ops, timeout_s = RESUMED_OPS, 2
    phases, resumed, why = _phases(tmp_path, ops, transport, "self", timeout_s, {})
    wrong = []
    for k, op in enumerate(ops):
        for rank in (0, 2):
            err = phases[k].get(rank, {}).get("error", "")
            if " Timed out " not in err and "aborted" not in err:
                wrong.append(f"{op}: rank {rank}: {err or phases[k].get(rank)}")
        r1 = phases[k].get(1, {})
        # The abort, not a deadline, ends it.
        late = r1.get("t_error", float("inf")) - resumed.get(k, 0)
        if "aborted" not in r1.get("error", "") or late > timeout_s / 2:
            wrong.append(f"{op}: rank 1, {late:.2f} s after its resume: {r1.get('error') or r1}")
        # In the op its peers failed, not in the next one, though the data it needs may all be
        # there: over shared memory the abort is in its segment before it resumes. Over TCP the
        # abort is a frame that its I/O thread may read only after the op began, and the op may
        # complete first: then the next op fails at once.
        if transport == "auto" and r1.get("in_flight") != "failed":
            wrong.append(f"{op}: rank 1 completed the op its peers failed: {r1.get('error') or r1}")
    assert not wrong, "\n".join(wrong) + "\n" + why
    print("\n".join(f"{op}: rank 1 +{phases[k][1]['t_error'] - resumed[k]:.3f} s, the op in flight "
                    f"{phases[k][1].get('in_flight')}: {phases[k][1]['error']}"
                    for k, op in enumerate(ops)))

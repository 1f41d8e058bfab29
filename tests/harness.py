"""Multi-process test harness for the ringreduce process-group backend.

Starting a rank costs time (its group's set-up; importing torch, 2-3 s here, is done once, in
the fork server the ranks come from) and CI has 2 cores, so ranks are started once per
(world size, environment) as a *pool* and every test sends work to the pool instead of
starting its own processes:

    pool = Pool(4, env={"RINGREDUCE_SLICE_BYTES": "64"})
    per_rank = pool.run(some_module_level_fn, arg1, arg2, timeout=60)

Each rank runs ``some_module_level_fn(ctx, arg1, arg2)`` (see ``Ctx``) and ``run``
returns the per-rank return values, indexed by rank.  The function travels by module
and name, the arguments and results by pickle, so both must be plain picklable data.

Failure handling (every wait below has a deadline; there are no sleeps):

* a rank that raises: the call fails with that rank's traceback (the first rank to
  fail, in time order); the pool stays usable if all other ranks answered, otherwise
  the others get a short grace period and the pool is killed (and restarted lazily on
  the next call);
* a rank that does not answer by the deadline: the call fails naming those ranks,
  with their Python stacks (faulthandler dump on SIGTERM), and the pool is killed;
* a rank that dies: the call fails with its exit code, and the pool is killed.

Every rank initialises the default process group with the backend under test
(``RINGREDUCE_TEST_BACKEND``, default "ringreduce"; "gloo" is a stand-in used to develop
the tests) and, over the same ranks, a gloo group used as the comparison oracle.

The reference arithmetic the tests check results with (the dtype and op tables, input
generation, float64 / exact-integer references, tolerances) is in reference.py; this file
keeps the cross-rank check of results (``check_results``, ``digest``).  Both import torch
lazily, and the fork server loads nothing of ringreduce, so that a rank process applies its
environment (the parent's whole environment, then the pool's) before the backend is imported.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import itertools
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
import warnings
from multiprocessing import connection as mp_connection
import multiprocessing as mp

BACKEND_ENV = "RINGREDUCE_TEST_BACKEND"
SEED_ENV = "RINGREDUCE_TEST_SEED"
OP_TIMEOUT_ENV = "RINGREDUCE_TEST_OP_TIMEOUT"  # seconds; process-group timeout in the ranks

DEFAULT_CALL_TIMEOUT = 120.0
START_TIMEOUT = 180.0
# After one rank has failed, how long the others may still take to answer before the
# pool is considered stuck (they are usually blocked in a collective the failed rank
# never joined).
FAILURE_GRACE = 10.0
CLOSE_TIMEOUT = 30.0


def backend_under_test() -> str:
    return os.environ.get(BACKEND_ENV, "ringreduce").strip().lower() or "ringreduce"


def standin() -> bool:
    """True when gloo stands in for ringreduce (developing the tests without the backend)."""
    return backend_under_test() != "ringreduce"


def base_seed() -> int:
    """Session seed: RINGREDUCE_TEST_SEED if set, else drawn once and pinned in the env
    (so spawned ranks and a re-run with the printed value see the same one)."""
    s = os.environ.get(SEED_ENV)
    if not s:
        s = str(int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF)
        os.environ[SEED_ENV] = s
    return int(s)


def mix_seed(*parts) -> int:
    """A 63-bit seed from any reprs; stable across processes (unlike hash())."""
    h = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFFFFFFFFFF


def needs_ringreduce():
    """A pytest mark that skips a test, with the reason, where the extension is not built."""
    import pytest

    try:
        import ringreduce

        ringreduce.load_extension()
    except ImportError as e:
        return pytest.mark.skipif(True, reason=f"the ringreduce backend is not built yet (`make build`): {e}")
    return pytest.mark.skipif(False, reason="")


def launch_script_ranks(tmp_path, world, code, case, env, timeout=120):
    """Run ``code`` (a worker script) as ``world`` ranks under env:// on a free port, each with
    CASE=case, OUT=tmp_path and ``env``; each worker writes ``rank{r}.json`` into OUT. Returns
    (results by rank, the start time, a text for assertion messages: the results and each rank's
    output tail). Fails the test if a rank hangs past ``timeout``."""
    import json
    import subprocess

    import pytest

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    port = free_port()
    procs = []
    for rank in range(world):
        e = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                 MASTER_PORT=str(port), CASE=case, OUT=str(tmp_path),
                 RINGREDUCE_FLIGHT_DIR=str(tmp_path / "flight"),
                 PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    start = time.time()
    outputs = outputs_or_fail(procs, timeout, f"{case}: a rank hung")
    results = {r: json.loads((tmp_path / f"rank{r}.json").read_text())
               for r in range(world) if (tmp_path / f"rank{r}.json").exists()}
    why = json.dumps(results, indent=1) + "".join(f"\n--- rank {r} ---\n{o[-2000:]}" for r, o in enumerate(outputs))
    return results, start, why


def outputs_or_fail(procs, timeout, what):
    """Each process's output once it exits; if one is still running after `timeout` seconds,
    every one is killed and the test fails with `what`."""
    import subprocess

    import pytest

    outputs = []
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(what)
    return outputs


def free_port() -> int:
    """A port that was free a moment ago.  Binding port 0 and closing leaves a small
    race; ``Pool`` retries start-up with a new port on EADDRINUSE."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailure(AssertionError):
    """A pool call failed: a rank raised, died, or did not answer in time."""


# --------------------------------------------------------------------------------------
# rank side


class Ctx:
    """What a function run by ``Pool.run`` gets as its first argument.

    rank, world_size, backend  -- of the default process group (the backend under test)
    group                      -- the default group (dist.group.WORLD)
    gloo                       -- a gloo group over the same ranks, the comparison oracle
    store                      -- the rendezvous store
    seed                       -- this call's seed, the same on every rank
    rng                        -- torch.Generator seeded from (seed, rank): differs per rank
    gen(*key, rank=None)       -- torch.Generator seeded from (seed, key, rank); any rank can
                                  rebuild any other rank's inputs with it, so references
                                  need no communication
    """

    def __init__(self, rank, world_size, backend, group, gloo, store, seed, env):
        import torch

        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.group = group
        self.gloo = gloo
        self.store = store
        self.seed = seed
        self.env = env
        self._torch = torch
        self.rng = self.gen("ctx.rng", rank=rank)

    def gen(self, *key, rank=None):
        g = self._torch.Generator()
        g.manual_seed(mix_seed(self.seed, key, rank))
        return g


def _load_function(modname, qualname, modfile):
    try:
        mod = importlib.import_module(modname)
    except ImportError:
        if not modfile:
            raise
        spec = importlib.util.spec_from_file_location(modname, modfile)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _send(conn, obj):
    try:
        data = pickle.dumps(obj)
    except Exception:
        data = pickle.dumps(("err", obj[1], "result could not be pickled:\n" + traceback.format_exc()))
    conn.send_bytes(data)


def _rank_main(rank, world_size, backend, init, env, extra_path, stack_file, conn):
    # Environment first: the backend reads its knobs when torch / ringreduce load.
    os.environ.update(env)
    for p in extra_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    import faulthandler

    # On SIGTERM (sent to a stuck rank) dump every thread's Python stack, then die.
    stack_fh = open(stack_file, "w")
    faulthandler.register(signal.SIGTERM, file=stack_fh, all_threads=True, chain=True)

    try:
        from datetime import timedelta

        import torch  # noqa: F401
        import torch.distributed as dist

        if backend == "ringreduce":
            import ringreduce  # noqa: F401  (registers the backend)

        timeout = timedelta(seconds=float(os.environ.get(OP_TIMEOUT_ENV, "60")))
        if init[0] == "filestore":
            store = dist.FileStore(init[1], world_size)
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(
                backend, init_method=init[1], rank=rank, world_size=world_size, timeout=timeout
            )
            store = dist.distributed_c10d._get_default_store()
        gloo = dist.new_group(backend="gloo")
        group = dist.group.WORLD
    except BaseException:
        _send(conn, ("init_err", None, traceback.format_exc()))
        return
    _send(conn, ("ready", None, os.getpid()))

    while True:
        try:
            msg = pickle.loads(conn.recv_bytes())
        except EOFError:  # the parent went away
            return
        if msg is None:
            break
        call_id, modname, qualname, modfile, args, seed = msg
        try:
            fn = _load_function(modname, qualname, modfile)
            ctx = Ctx(rank, world_size, backend, group, gloo, store, seed, env)
            result = fn(ctx, *args)
            _send(conn, ("ok", call_id, result))
        except BaseException:
            _send(conn, ("err", call_id, traceback.format_exc()))
        del msg
    try:
        dist.destroy_process_group()
    finally:
        _send(conn, ("closed", None, None))
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip the interpreter's teardown of torch: it costs about a second per rank
        # and there is nothing left to clean up.
        os._exit(0)


# --------------------------------------------------------------------------------------
# parent side


def _signal(proc, sig):
    try:
        if proc.pid is not None and proc.exitcode is None:
            os.kill(proc.pid, sig)
    except ProcessLookupError:
        pass


def _fmt_args(args, limit=300):
    s = ", ".join(repr(a) for a in args)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _last_line(tb: str) -> str:
    lines = [ln for ln in tb.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else tb


_CONTEXT = None


def _rank_context():
    """Rank processes come from a fork server that has imported torch: a process that imports
    it anew takes 2-3 s of a CPU here, and the suite starts a few hundred ranks. Nothing of
    ringreduce is loaded before a rank has set its environment (_rank_main)."""
    global _CONTEXT
    if _CONTEXT is None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch"])
        _CONTEXT = ctx
    return _CONTEXT


class Pool:
    """N rank processes (from the fork server, _rank_context), each with the default group of
    the backend under test plus a gloo group; see the module docstring."""

    _call_ids = itertools.count(1)

    def __init__(self, world_size, env=None, backend=None, init_method=None, start_timeout=START_TIMEOUT):
        self.world_size = world_size
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.backend = backend or backend_under_test()
        # None: a FileStore in a fresh temp dir (race-free).  Otherwise a URL string, or a
        # callable returning one per start (tcp:// with a fresh port for each retry).
        self.init_method = init_method
        self.start_timeout = start_timeout
        self._procs = []
        self._conns = []
        self._tmpdir = None
        self.starts = 0

    # -- lifecycle -------------------------------------------------------------------

    def __repr__(self):
        env = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return f"Pool(world={self.world_size}, backend={self.backend}{', ' + env if env else ''})"

    @property
    def alive(self):
        return bool(self._procs)

    def start(self):
        __tracebackhide__ = True
        attempts = 3 if callable(self.init_method) else 1
        for attempt in range(attempts):
            try:
                self._start_once()
                return
            except RankFailure as e:
                if attempt + 1 < attempts and "address already in use" in str(e).lower():
                    continue
                raise

    def _start_once(self):
        __tracebackhide__ = True
        self.kill()
        self._tmpdir = tempfile.mkdtemp(prefix="ringreduce-pool-")
        if self.init_method is None:
            init = ("filestore", os.path.join(self._tmpdir, "store"))
        else:
            url = self.init_method() if callable(self.init_method) else self.init_method
            init = ("url", url)
        here = os.path.dirname(os.path.abspath(__file__))
        ctx = _rank_context()
        # The whole environment, as a spawned process would inherit it: the fork server's is the
        # one it started with.
        env = {**os.environ, BACKEND_ENV: self.backend, SEED_ENV: str(base_seed()), **self.env}
        for r in range(self.world_size):
            parent_end, child_end = ctx.Pipe(duplex=True)
            p = ctx.Process(
                target=_rank_main,
                args=(r, self.world_size, self.backend, init, env, [here],
                      self._stack_file(r), child_end),
                name=f"ringreduce-rank{r}",
                daemon=True,
            )
            p.start()
            child_end.close()
            self._procs.append(p)
            self._conns.append(parent_end)
        self.starts += 1
        answers, errors, missing = self._collect(None, self.start_timeout)
        if errors or missing:
            msg = self._failure_text(f"starting {self!r} (init {init[1]})", errors, missing, self.start_timeout)
            self.kill()
            raise RankFailure(msg)

    def _stack_file(self, rank):
        return os.path.join(self._tmpdir, f"rank{rank}.stack")

    def close(self, timeout=CLOSE_TIMEOUT):
        """Ask every rank to destroy its process groups and exit; kill what is left at the
        deadline."""
        if not self._procs:
            return
        for c in self._conns:
            try:
                c.send_bytes(pickle.dumps(None))
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.join(max(0.0, deadline - time.monotonic()))
        stuck = [r for r, p in enumerate(self._procs) if p.exitcode is None]
        if stuck:
            warnings.warn(f"{self!r}: ranks {stuck} did not exit within {timeout:.0f}s of being asked "
                          "to (destroy_process_group hung?); killed", RuntimeWarning, stacklevel=2)
        self.kill()

    def kill(self):
        """Stop every rank now (SIGTERM, which dumps stacks, then SIGKILL)."""
        procs, self._procs = self._procs, []
        conns, self._conns = self._conns, []
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in conns:
            c.close()
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # -- calls -----------------------------------------------------------------------

    def run(self, fn, *args, timeout=DEFAULT_CALL_TIMEOUT, seed=None):
        """Run ``fn(ctx, *args)`` on every rank; return the results indexed by rank."""
        __tracebackhide__ = True
        if not self._procs:
            self.start()
        modname = fn.__module__
        qualname = fn.__qualname__
        modfile = getattr(sys.modules.get(modname), "__file__", None)
        if seed is None:
            seed = mix_seed(base_seed(), modname, qualname, _fmt_args(args, 10_000))
        call_id = next(self._call_ids)
        payload = pickle.dumps((call_id, modname, qualname, modfile, args, seed))
        for c in self._conns:
            c.send_bytes(payload)
        answers, errors, missing = self._collect(call_id, timeout)
        if errors or missing:
            what = (f"{self!r}.run({modname}.{qualname}({_fmt_args(args)}), seed={seed}; "
                    f"rerun with {SEED_ENV}={base_seed()})")
            died = any(e[0] == "died" for e in errors.values())
            msg = self._failure_text(what, errors, missing, timeout)
            if missing or died:
                self.kill()
                msg += "\n(the pool was killed; the next call starts a fresh one)"
            raise RankFailure(msg)
        return [answers[r] for r in range(self.world_size)]

    def _collect(self, call_id, timeout):
        """Wait (blocking, with a deadline) for one answer per rank.

        Returns (answers {rank: value}, errors {rank: (kind, text, order)}, missing [ranks]).
        """
        deadline = time.monotonic() + timeout
        answers, errors = {}, {}
        pending = set(range(self.world_size))
        order = itertools.count()
        grace_applied = False
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waitables = {}
            for r in pending:
                waitables[self._conns[r]] = r
                waitables[self._procs[r].sentinel] = r
            ready = mp_connection.wait(list(waitables), timeout=remaining)
            handled = set()
            # Answers first: a rank may have answered and then exited.
            for obj in sorted(ready, key=lambda o: not isinstance(o, mp_connection.Connection)):
                r = waitables[obj]
                if r in handled or r not in pending:
                    continue
                conn = self._conns[r]
                if isinstance(obj, mp_connection.Connection) or conn.poll(0):
                    try:
                        kind, cid, value = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        kind, cid, value = "died", call_id, None
                else:
                    kind, cid, value = "died", call_id, None
                handled.add(r)
                if kind == "died":
                    p = self._procs[r]
                    p.join(5)
                    errors[r] = ("died", f"rank {r} died (exit code {p.exitcode})", next(order))
                    pending.discard(r)
                    continue
                if cid != call_id and kind not in ("init_err",):
                    errors[r] = ("err", f"rank {r} answered call {cid}, expected {call_id}", next(order))
                elif kind in ("ok", "ready"):
                    answers[r] = value
                else:
                    errors[r] = ("err", value, next(order))
                pending.discard(r)
            if errors and not grace_applied:
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE)
                grace_applied = True
        return answers, errors, sorted(pending)

    def _failure_text(self, what, errors, missing, timeout):
        parts = [f"{what} failed"]
        if errors:
            first_rank, (kind, text, _) = min(errors.items(), key=lambda kv: kv[1][2])
            others = sorted(r for r in errors if r != first_rank)
            parts.append(
                f"rank {first_rank} failed first"
                + (f" (ranks {others} failed too)" if others else "")
                + ":\n" + text.rstrip()
            )
            for r in others:
                parts.append(f"rank {r}: {_last_line(errors[r][1])}")
        if missing:
            answered = sorted(set(range(self.world_size)) - set(missing))
            parts.append(
                f"ranks {missing} did not answer within {timeout:.0f}s"
                + (f" (after the first failure: {FAILURE_GRACE:.0f}s grace)" if errors else "")
                + f"; ranks {answered} answered"
            )
            # Stop the stuck ranks now so their stacks can be shown: freeze them all
            # first (SIGSTOP), so that none moves on when a peer dies, then SIGTERM (the
            # rank's faulthandler dumps its stacks, then it dies) and SIGCONT each.
            stacks = []
            procs = [self._procs[r] for r in missing]
            for p in procs:
                _signal(p, signal.SIGSTOP)
            for p in procs:
                _signal(p, signal.SIGTERM)
                _signal(p, signal.SIGCONT)
                p.join(5)
            for r in missing:
                try:
                    with open(self._stack_file(r)) as f:
                        dump = f.read().strip()
                except OSError:
                    dump = ""
                if dump:
                    stacks.append(f"--- python stacks of rank {r} when it was stopped ---\n{dump[-4000:]}")
            parts.extend(stacks)
        return "\n".join(parts)


def check_results(results, max_lines=40):
    """``results``: per rank, (failures [str naming the case], digests {case: hash}).
    Fail with every case that failed on any rank, and every case whose result bytes
    differ between ranks."""
    __tracebackhide__ = True
    failures = [f for fails, _ in results for f in fails]
    for name in dict.fromkeys(n for _, digests in results for n in digests):
        per_rank = [d.get(name) for _, d in results]
        if len(set(per_rank)) > 1:
            failures.append(f"{name}: results are not bit-identical across ranks: "
                            + ", ".join(f"rank {r}: {h}" for r, h in enumerate(per_rank)))
    if failures:
        shown = "\n".join(failures[:max_lines])
        more = f"\n... and {len(failures) - max_lines} more" if len(failures) > max_lines else ""
        import pytest

        pytest.fail(f"{len(failures)} failure(s):\n{shown}{more}", pytrace=False)


def digest(t) -> str:
    """Hash of a tensor's bytes, for the bit-identical-across-ranks check."""
    import torch

    flat = t.detach().reshape(-1).contiguous()
    if flat.numel() == 0:
        b = b""
    else:
        b = flat.view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(b, digest_size=16).hexdigest()


def shm_entries():
    """ringreduce's named segments in /dev/shm now (the fallback's; memfd segments have no name)."""
    return {n for n in os.listdir("/dev/shm") if n.startswith("ringreduce-")}


def can_unshare_pid():
    """Whether this machine lets a process start children in a PID namespace of their own."""
    import subprocess
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False

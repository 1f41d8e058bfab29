"""The backend as users meet it: an unmodified script under torchrun that never imports
ringreduce (the torch.backends entry point of the installed package registers it), a
clean ``import torch``, and the tcp:// and file:// init methods."""

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

import pytest

import harness

SCRIPT = textwrap.dedent(
    """
    import os
    import torch
    import torch.distributed as dist

    # A user's script: no `import ringreduce` anywhere.
    dist.init_process_group({backend!r})
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(os.environ["WORLD_SIZE"]), (world, os.environ["WORLD_SIZE"])
    assert dist.get_backend() == {backend!r}, dist.get_backend()

    def data(r, n=100_003):
        g = torch.Generator().manual_seed(1234 + r)
        return torch.randint(-1000, 1000, (n,), generator=g).to(torch.float32)

    expect = sum(data(r).double() for r in range(world))

    x = data(rank)
    w = dist.all_reduce(x, op=dist.ReduceOp.SUM, async_op=True)
    w.wait()
    assert torch.equal(x.double(), expect), "SUM is wrong"

    y = data(rank)
    w = dist.all_reduce(y, op=dist.ReduceOp.AVG, async_op=True)
    w.wait()
    assert torch.allclose(y.double(), expect / world, rtol=1e-6, atol=1e-6), "AVG is wrong"

    dist.destroy_process_group()
    print(f"OK rank {{rank}}/{{world}}", flush=True)
    """
)


def _clean_env():
    """The caller's environment minus the test-only knobs and anything that would stop
    torch from loading backend plugins."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RINGREDUCE_") and k not in ("TORCH_DEVICE_BACKEND_AUTOLOAD",)}
    env.pop("PYTHONWARNINGS", None)
    return env


def _entry_points():
    return [ep for ep in importlib.metadata.entry_points(group="torch.backends") if ep.name == "ringreduce"]


@pytest.fixture
def installed(backend):
    if backend != "ringreduce":
        pytest.skip("gloo stand-in: no entry point to test")
    if not _entry_points():
        pytest.fail("ringreduce is not installed with a torch.backends entry point "
                    "(pip install --no-build-isolation --no-deps -e .)", pytrace=False)


def test_torchrun_unmodified_script(tmp_path, backend, request):
    if backend == "ringreduce":
        request.getfixturevalue("installed")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(backend=backend))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           str(script)]
    try:
        p = subprocess.run(cmd, cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in 240s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}", pytrace=False)
    oks = sorted(re.findall(r"OK rank \d/4", p.stdout))  # the ranks' lines may interleave
    assert p.returncode == 0 and oks == [f"OK rank {r}/4" for r in range(4)], (
        f"torchrun exit code {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-8000:]}")


def test_import_torch_is_clean(installed, tmp_path):
    """`import torch` with ringreduce installed: no warning, no error, and the entry point
    has registered the backend without `import ringreduce`."""
    code = textwrap.dedent(
        """
        import sys, warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            import torch
            import torch.distributed as dist
        for w in caught:
            print("WARNING:", w.category.__name__, w.message, file=sys.stderr)
        print("registered", "ringreduce" in dist.Backend.backend_list)
        """
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_clean_env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"import torch failed:\n{p.stderr[-4000:]}"
    assert "registered True" in p.stdout, f"ringreduce not registered by the entry point:\n{p.stdout}\n{p.stderr}"
    noise = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert not noise, "import torch printed to stderr:\n" + "\n".join(noise[:30])


def test_import_torch_survives_a_broken_extension(installed, tmp_path):
    """The hook runs inside every `import torch`: if the extension cannot load, torch must still
    import, with one warning that says why and how to silence it."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["ringreduce._C"] = None  # as if the extension were missing or broken
        import torch
        x = torch.ones(3) + 1
        print("torch works", x.tolist())
        """
    )
    env = _clean_env()
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "torch works [2.0, 2.0, 2.0]" in p.stdout, p.stderr[-4000:]
    warnings = [ln for ln in p.stderr.splitlines() if "RuntimeWarning" in ln]
    assert len(warnings) == 1, p.stderr
    assert "ringreduce._C cannot be loaded" in p.stderr and "RINGREDUCE_AUTOLOAD=0" in p.stderr, p.stderr

    # With warnings turned into errors the hook must still not break torch: it writes instead.
    p = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "torch works" in p.stdout, p.stderr[-4000:]
    assert "ringreduce._C cannot be loaded" in p.stderr, p.stderr

    env["RINGREDUCE_AUTOLOAD"] = "0"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr[-4000:]


def _rank_init_method_check(ctx):
    import torch
    import torch.distributed as dist

    assert dist.get_backend() == ctx.backend, dist.get_backend()
    xs = [torch.randint(-100, 100, (5003,), generator=ctx.gen("x", rank=r)).double()
          for r in range(ctx.world_size)]
    t = xs[ctx.rank].clone()
    dist.all_reduce(t, async_op=True).wait()
    assert torch.equal(t, sum(xs)), "SUM is wrong"
    dist.broadcast(t, src=ctx.world_size - 1)
    return harness.digest(t)


def _run_init_method(init_method, world=2):
    pool = harness.Pool(world, init_method=init_method)
    try:
        pool.start()
        digests = pool.run(_rank_init_method_check, timeout=60)
        assert len(set(digests)) == 1, digests
    finally:
        pool.close()


def test_tcp_init_method(backend):
    _run_init_method(lambda: f"tcp://127.0.0.1:{harness.free_port()}")


def test_file_init_method(backend, tmp_path):
    _run_init_method(f"file://{tmp_path / 'rendezvous'}")


RESTART_SCRIPT = textwrap.dedent(
    """
    import os
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank = int(os.environ["RANK"])
    if attempt == 0 and rank == 1:
        # Rank 0 is inside init_process_group by now, its segment created and its number drawn
        # on torchrun's store, which outlives the attempt; torchrun ends it and restarts both.
        time.sleep(1.0)  # sleep-ok: the fault is a death while the peer is inside init, which this process cannot observe
        os._exit(3)
    dist.init_process_group("ringreduce", timeout=timedelta(seconds=30))
    x = torch.full((1000,), float(rank + 1))
    dist.all_reduce(x)
    assert bool((x == 3).all()), x[:4]
    dist.destroy_process_group()
    print(f"TRAINED attempt {attempt} rank {rank}", flush=True)
    """
)


def _shm_names():
    return {n for n in os.listdir("/dev/shm") if n.startswith("ringreduce-")}


def test_torchrun_restarts_after_a_rank_died_during_init(installed, tmp_path):
    """A rank that dies while its peer is inside init_process_group leaves state on torchrun's
    store, which survives restarts: the next attempt must not read it (it deadlocked in init, each
    rank waiting for keys of another incarnation). The peer, ended inside init, leaves nothing in
    /dev/shm: its segments have no name (memfd)."""
    before = _shm_names()
    script = tmp_path / "train.py"
    script.write_text(RESTART_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--max-restarts", "1", str(script)]
    try:
        p = subprocess.run(cmd, cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"torchrun did not finish in 240s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}", pytrace=False)
    trained = sorted(re.findall(r"TRAINED attempt 1 rank \d", p.stdout))
    assert p.returncode == 0 and trained == ["TRAINED attempt 1 rank 0", "TRAINED attempt 1 rank 1"], (
        f"torchrun exit code {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-8000:]}")
    # A later group on this host, which would sweep a named segment left behind, finds none.
    _run_init_method(f"tcp://127.0.0.1:{harness.free_port()}", world=1)
    assert not _shm_names() - before, f"left in /dev/shm: {_shm_names() - before}"

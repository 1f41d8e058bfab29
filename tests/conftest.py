"""pytest fixtures for the ringreduce tests.

Backend under test: ``--backend ringreduce`` (default) or ``--backend gloo``, or the
environment variable RINGREDUCE_TEST_BACKEND.  gloo is a stand-in for developing the
tests before the backend exists: cases gloo cannot do are skipped then, never with
ringreduce.  With ringreduce, a failing ``import ringreduce`` fails every test that needs
the backend, with the import error.

Seed: RINGREDUCE_TEST_SEED=<n> reproduces a run (the value is printed in the header).
"""

import os
import traceback

import pytest

import harness

MAX_LIVE_RANKS_ENV = "RINGREDUCE_TEST_MAX_RANKS"


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        default=None,
        choices=["ringreduce", "gloo"],
        help="process-group backend under test (default: $RINGREDUCE_TEST_BACKEND or ringreduce)",
    )


def pytest_configure(config):
    b = config.getoption("--backend")
    if b:
        os.environ[harness.BACKEND_ENV] = b  # ranks and subprocesses read it from here
    harness.base_seed()  # pin the session seed before any rank starts
    # Groups that fail on purpose dump their flight recorders: into this session's own directory
    # (ranks and subprocesses inherit it), not the machine's default one.
    if "RINGREDUCE_FLIGHT_DIR" not in os.environ:
        import tempfile
        os.environ["RINGREDUCE_FLIGHT_DIR"] = tempfile.mkdtemp(prefix="ringreduce-flight-tests-")


def pytest_report_header(config):
    return (f"ringreduce tests: backend={harness.backend_under_test()} "
            f"{harness.SEED_ENV}={harness.base_seed()}")


_import_error = []


def _ringreduce_import_error():
    """'' if ``import ringreduce`` works in this process, else its traceback (cached)."""
    if not _import_error:
        try:
            import ringreduce  # noqa: F401
            _import_error.append("")
        except BaseException:
            _import_error.append(traceback.format_exc())
    return _import_error[0]


@pytest.fixture(scope="session")
def backend():
    """Name of the backend under test (a test using it fails if ringreduce is under test
    and cannot be imported: see pytest_runtest_call)."""
    return harness.backend_under_test()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    # Fail (not error, not skip) every test that needs the backend when it cannot be imported.
    if "backend" in getattr(item, "fixturenames", ()) and harness.backend_under_test() == "ringreduce":
        err = _ringreduce_import_error()
        if err:
            pytest.fail(
                "import ringreduce failed (build it: pip install --no-build-isolation --no-deps -e .; "
                "or run the tests against the gloo stand-in with --backend gloo):\n" + err,
                pytrace=False,
            )


class _Pools:
    """Pools cached by (world size, env) for the whole session; the least recently used
    ones are closed when more than RINGREDUCE_TEST_MAX_RANKS (default 10) ranks are up."""

    def __init__(self):
        self.pools = {}  # key -> Pool, in use order (dict keeps insertion order)
        self.max_ranks = int(os.environ.get(MAX_LIVE_RANKS_ENV, "10"))

    def get(self, world_size, env=None):
        key = (world_size, tuple(sorted((env or {}).items())))
        pool = self.pools.pop(key, None)
        if pool is None:
            pool = harness.Pool(world_size, env=env)
            live = sum(p.world_size for p in self.pools.values() if p.alive)
            for k in list(self.pools):
                if live + world_size <= self.max_ranks:
                    break
                old = self.pools.pop(k)
                if old.alive:
                    live -= old.world_size
                    old.close()
        self.pools[key] = pool
        return pool

    def close(self):
        for p in self.pools.values():
            p.close()
        self.pools.clear()


@pytest.fixture(scope="session")
def _pools():
    pools = _Pools()
    yield pools
    pools.close()


@pytest.fixture
def ranks(backend, _pools):
    """``ranks(world_size, env=None)`` -> a started ``harness.Pool`` (cached per session).

    ``env`` is applied in the rank processes before torch is imported, e.g.
    ``ranks(4, env={"RINGREDUCE_SLICE_BYTES": "64", "RINGREDUCE_SLOTS": "2"})``.
    """

    def get(world_size, env=None):
        __tracebackhide__ = True
        pool = _pools.get(world_size, env)
        if not pool.alive:
            pool.start()
        return pool

    return get


@pytest.fixture
def standin(backend):
    return backend != "ringreduce"

"""A part of torch's own DistributedTest suite on ringreduce (scripts/torch_suite.py): every test
of it must pass, as each does on gloo. The part covers what the suite found (the legacy coalesced
all-gather layout, a timed-out barrier's words, sparse all-reduce) and an async all-reduce; it is
kept small, as every test starts its own ranks, and gloo is not run beside it here (that doubled
its time); `make test-torch-suite` runs the whole suite on both and compares."""

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# The coalesced all-gather's complex case (tensors of several shapes per rank) and its empty one;
# its simple and full-group cases run the same layout code (make test-torch-suite runs them).
PART = [
    "test_all_gather_coalesced_complex", "test_all_gather_coalesced_with_empty",
    "test_barrier_timeout_full_group", "test_sparse_all_reduce_sum", "test_all_reduce_sum_async",
]


def test_ringreduce_passes_what_gloo_passes_in_a_part_of_torchs_suite(tmp_path, capsys):
    if os.environ.get("RINGREDUCE_TEST_BACKEND", "ringreduce") != "ringreduce":
        pytest.skip("compares ringreduce with gloo")
    if importlib.util.find_spec("expecttest") is None:
        pytest.skip("torch's suite needs expecttest (make setup installs it)")
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import torch_suite
    finally:
        sys.path.pop(0)
    select = " or ".join(PART)
    rc = torch_suite.main(["-k", select, "--min-ratio", "1.0", "--out", str(tmp_path),
                           "--timeout", "1200", "--no-gloo"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"ringreduce passes {len(PART)} of the {len(PART)} selected" in out, out

"""Tests of benchmarks/tp_decode.py: tensor-parallel decode end to end at a toy size (DTensor and the
hand-split model, on gloo and ringreduce), and its closing lines from made-up rows.

The subprocess run is a 2-layer model of hidden 64 decoding 4 tokens after an 8-token prompt, one
round: it tests that every setup runs, that ringreduce's tokens are gloo's and that the summary is
printed, not the numbers. torch.compile and DeepSpeed are left out (compiling takes tens of seconds
here; DeepSpeed lives in another venv).
"""

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

import harness

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "benchmarks", "tp_decode.py")

# benchmarks/ is no package: load the script as a module (registered first, as its dataclasses need).
_spec = importlib.util.spec_from_file_location("bench_tp_decode", SCRIPT)
tp = sys.modules["bench_tp_decode"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tp)

TOY = ["--hidden", "64", "--layers", "2", "--heads", "4", "--mlp", "128", "--vocab", "256",
       "--prompt", "8", "--tokens", "4", "--rounds", "1", "--timeout", "100"]
CLOSING = re.compile(r"^# TP decode, 2 ranks: ringreduce = (\S+) gloo \(DTensor eager\), (\S+) gloo "
                     r"\(DTensor compiled\), (\S+) DeepSpeed \(hand-split\)$", re.M)
FLOOR = re.compile(r"^# hand-split: ringreduce direct op at (\S+) of the no-communication floor's tokens/s$", re.M)


needs_ringreduce = harness.needs_ringreduce()


@needs_ringreduce
def test_toy_decode_ringreduce_tokens_match_gloo(tmp_path):
    import ringreduce

    direct = hasattr(ringreduce, "all_reduce_")
    setups = ["dtensor-gloo", "dtensor-rr", "dtensor-none", "split-gloo", "split-rr", "split-direct"]
    path = tmp_path / "tp.json"
    out = subprocess.run([sys.executable, SCRIPT, *TOY, "--setups", ",".join(setups), "--json", str(path)],
                         cwd=REPO, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr[-4000:]}"

    rows = json.loads(path.read_text())["rows"]
    assert sorted(rows) == sorted(setups), rows
    communicating = [k for k in setups if k != "dtensor-none"]
    ran = communicating if direct else communicating[:-1]
    reference = rows["dtensor-gloo"]["tokens"]
    assert len(reference) == 4 and all(0 <= t < 256 for t in reference), reference
    for key in ran:
        row = rows[key]
        assert row["error"] is None, (key, row)
        assert row["tokens"] == reference, (key, row["tokens"], reference)
        assert row["ranks_agree"], key
        assert row["ms_per_token"] > 0 and row["prefill_ms"] > 0, row
    if not direct:
        assert rows["split-direct"]["error"] == "not available in this build"
    # The DTensor floor, on torch's fake process group, runs, and without communication: its ranks
    # disagree or its tokens differ. (With unnamed meshes its all-reduces went through the group of
    # the DTensor model that ran first, gloo's, and it matched.)
    none = rows["dtensor-none"]
    assert none["error"] is None and none["ms_per_token"] > 0, none
    assert none["tokens"] != reference or not none["ranks_agree"], none
    assert re.search(r"^# DTensor eager: ringreduce at \d+% and gloo at \d+% of the no-communication floor's "
                     r"tokens/s; the floor is [\d.]+x gloo's tokens/s", out.stdout, re.M), out.stdout

    table = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("  ")}
    for key in ran[1:]:
        assert table[key].endswith("  match"), table[key]
    assert table["dtensor-gloo"].endswith("  reference")
    m = CLOSING.search(out.stdout)
    assert m, out.stdout
    assert float(m.group(1).rstrip("x")) > 0
    assert m.group(2) == m.group(3) == "n/a"  # neither compiled nor DeepSpeed was asked for
    assert out.stdout.rstrip().splitlines()[-1] == m.group(0)  # the very last line
    assert FLOOR.search(out.stdout).group(1) == "n/a"  # no floor was run


def _row(ms, tokens=(1, 2, 3), error=None):
    return {"ms_per_token": ms, "prefill_ms": 10.0, "warmup_s": 0.1, "tokens": list(tokens), "error": error,
            "ranks_agree": True}


def test_closing_lines_from_rows():
    cfg = tp.argparse.Namespace(nproc=2, compile_backend="aot_eager")
    rows = {"dtensor-gloo": _row(40.0), "dtensor-rr": _row(20.0), "dtensor-none": _row(16.0, tokens=(7, 7, 7)),
            "dtensor-gloo-compiled": _row(30.0), "dtensor-rr-compiled": {"error": "compile failed: boom"},
            "split-rr": _row(10.0), "split-direct": _row(8.0), "split-none": _row(6.0, tokens=(1, 5, 3)),
            "split-deepspeed": _row(12.0, tokens=(1, 2, 4)), tp.DS_FLOOR: _row(6.0, tokens=(9, 9, 9))}
    lines = tp.report(cfg, rows)
    text = "\n".join(lines)
    m = CLOSING.search(text)
    # tokens/s ratios: ringreduce's over the other's; a side that did not run is n/a.
    assert m.groups() == ("2.00x", "n/a", "1.50x"), text
    assert lines[-1] == m.group(0)
    assert FLOOR.search(text).group(1) == "75%"
    table = {line.split()[0]: line for line in lines if line.startswith("  ")}
    assert "compile failed: boom" in table["dtensor-rr-compiled"]
    assert table["split-deepspeed"].endswith("differ from token 3 of 3")
    assert "(no communication: expected)" in table["split-none"]
    assert "(no communication: expected)" in table["dtensor-none"]
    # The DTensor floor: 62.5 tokens/s against ringreduce's 50 and gloo's 25; no compiled floor ran.
    assert ("# DTensor eager: ringreduce at 80% and gloo at 40% of the no-communication floor's tokens/s; "
            "the floor is 2.50x gloo's tokens/s, the most any all-reduce could give") in lines
    assert not any(line.startswith("# DTensor compiled") for line in lines)
    # Without the direct op, ringreduce's hand-split side against DeepSpeed is dist.all_reduce's.
    rows["split-direct"] = {"error": "not available in this build"}
    text = "\n".join(tp.report(cfg, rows))
    assert CLOSING.search(text).group(3) == "1.20x"
    # The direct op timed in DeepSpeed's launch is what DeepSpeed is compared with, where it ran.
    rows[tp.DS_DIRECT] = _row(9.0)
    lines = tp.report(cfg, rows)
    assert CLOSING.search("\n".join(lines)).group(3) == "1.33x"
    assert any(line.startswith(f"  {tp.DS_DIRECT} ") and line.endswith("  match") for line in lines), lines
    assert FLOOR.search(text).group(1) == "n/a"
    assert "not available in this build" in text


def test_parse_args_setups():
    args = tp.parse_args(["--setups", "split-none, dtensor-gloo"])
    assert args.setups == ["dtensor-gloo", "split-none"]  # in the table's order
    assert tp.parse_args([]).setups == list(tp.BY_KEY)
    with pytest.raises(SystemExit):
        tp.parse_args(["--setups", "nccl"])
    with pytest.raises(SystemExit):
        tp.parse_args(["--heads", "3"])  # 1024 is not a multiple of 3


def test_a_setup_that_communicates_elsewhere_than_it_says_is_an_error():
    """The warm-up's op count on the ringreduce group: two all-reduces per layer and forward for a
    setup on ringreduce, none for any other."""
    cfg = tp.argparse.Namespace(layers=8, tokens=64)
    forwards = tp.WARMUP_TOKENS
    assert tp._wrong_group("dtensor-rr", 2 * 8 * forwards, cfg) is None
    assert tp._wrong_group("split-direct", 2 * 8 * forwards, cfg) is None
    assert "did not run on ringreduce" in tp._wrong_group("dtensor-rr-compiled", 0, cfg)
    assert tp._wrong_group("dtensor-gloo", 0, cfg) is None and tp._wrong_group("split-none@ds", 0, cfg) is None
    assert "which it does not use" in tp._wrong_group("dtensor-gloo", 3, cfg)

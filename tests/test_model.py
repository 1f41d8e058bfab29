"""The cost model (ringreduce/model.py) and the report of benchmarks/tcp_netns.py.

- The fit recovers alpha and beta from synthetic measurements made with known ones (with noise),
  and never returns a negative one.
- Predictions follow the algorithms' step and byte counts; the pick is the fastest; the
  hierarchical all-reduce only applies across hosts with several ranks each.
- `python -m ringreduce.model` prints the cluster table from the fit kept with the package, and a
  layout's table.
- tcp_netns.py's report, from saved measurements: the table, the model's check and the closing
  lines, which carry the figures they are computed from.
"""

import json
import os
import random
import re
import subprocess
import sys

import pytest

from ringreduce import model

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _synthetic(p, layouts, sizes, noise, seed):
    rng = random.Random(seed)
    out = []
    for hosts, per_host in layouts:
        for nb in sizes:
            t = model.predict(p, "ring", hosts, per_host, nb, ranks_sharing=hosts * per_host)
            out.append((hosts, per_host, nb, t * (1 + rng.uniform(-noise, noise))))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_the_fit_recovers_known_alpha_and_beta(seed):
    rng = random.Random(seed)
    truth = model.Params(shm=model.Link(alpha=rng.uniform(1e-6, 2e-5), beta=1 / rng.uniform(2e9, 2e10),
                                        share=rng.uniform(0.8, 2.0)),
                         tcp=model.Link(alpha=rng.uniform(2e-5, 2e-4), beta=1 / rng.uniform(5e8, 1e10),
                                        share=rng.uniform(0.0, 1.0)),
                         cores=2)
    sizes = [1 << k for k in range(10, 27, 2)]
    measured = _synthetic(truth, [(1, 2), (1, 4), (2, 1), (2, 2)], sizes, noise=0.02, seed=seed)
    got = model.fit(measured, cores=2)
    for name in ("shm", "tcp"):
        want, have = getattr(truth, name), getattr(got, name)
        assert have.alpha == pytest.approx(want.alpha, rel=0.15), (name, want, have)
        assert have.beta == pytest.approx(want.beta, rel=0.05), (name, want, have)
        # How its bytes slow down with 2 ranks per core: from the 1x4 ring (shared memory) and
        # the 2x2 ring (TCP).
        assert have.share == pytest.approx(want.share, abs=0.1), (name, want, have)
    # And the fit predicts what it was not fitted on (the hierarchical all-reduce) as the truth does.
    for nb in sizes:
        t = model.predict(truth, "hierarchical", 2, 2, nb, ranks_sharing=4)
        assert model.predict(got, "hierarchical", 2, 2, nb, ranks_sharing=4) == pytest.approx(t, rel=0.1)


def test_the_fit_never_goes_negative():
    # Times that fall with size would need a negative beta: it is fitted as 0 instead.
    pts = [(2.0, float(nb), 1e-3 / (1 + nb / 1e6), 1.0) for nb in (1e3, 1e5, 1e6, 1e7)]
    link = model.fit_link(pts)
    assert link.alpha >= 0 and link.beta >= 0
    with pytest.raises(ValueError, match="at least two"):
        model.fit_link(pts[:1])


def test_predictions_count_steps_and_bytes():
    p = model.Params(shm=model.Link(alpha=1e-6, beta=1e-10), tcp=model.Link(alpha=1e-4, beta=1e-9))
    m = 1 << 20
    # Flat ring across 2 hosts x 2 ranks: 6 TCP steps, 1.5 M through each hop.
    assert model.predict(p, "ring", 2, 2, m) == pytest.approx(6e-4 + 1.5 * m * 1e-9)
    # Hierarchical: 2 shm steps of M/2 each, then 2 TCP steps with M through the link.
    assert model.predict(p, "hierarchical", 2, 2, m) == pytest.approx(2e-6 + m * 1e-10 + 2e-4 + m * 1e-9)
    assert model.predict(p, "hierarchical", 1, 8, m) is None
    assert model.predict(p, "hierarchical", 8, 1, m) is None
    assert model.predict(p, "oneshot", 2, 2, m) is None
    assert model.predict(p, "oneshot", 1, 4, 2 * model.WINDOW_BYTES) is None
    # Ranks sharing cores slow each link's bytes by (ranks / cores) ** share, and not its steps.
    p.cores = 2
    assert model.predict(p, "ring", 1, 4, m, ranks_sharing=4) == pytest.approx(6e-6 + 1.5 * m * 1e-10)
    p.shm.share, p.tcp.share = 1.5, 0.5
    assert model.predict(p, "ring", 1, 4, m, ranks_sharing=4) == pytest.approx(6e-6 + 1.5 * m * 1e-10 * 2 ** 1.5)
    assert model.predict(p, "ring", 2, 1, m, ranks_sharing=4) == pytest.approx(2e-4 + m * 1e-9 * 2 ** 0.5)
    assert model.predict(p, "ring", 2, 1, m, ranks_sharing=2) == pytest.approx(2e-4 + m * 1e-9)
    assert model.predict(p, "ring", 2, 1, m, ranks_sharing=4, cores=0) == pytest.approx(2e-4 + m * 1e-9)
    algo, t = model.pick(p, 2, 4, m)
    assert algo == "hierarchical"
    assert t == min(model.predict(p, a, 2, 4, m) for a in ("ring", "hierarchical"))


def test_the_command_line_prints_the_tables(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "ringreduce.model"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if not line.startswith("#")]
    assert {r[0] for r in rows} == {"1", "8", "128", "1024"}, out.stdout
    assert any(r[1] == "1GiB" and r[0] == "1024" for r in rows), out.stdout
    for r in rows:
        if r[0] != "1" and r[1] == "1KiB":
            assert float(r[4].rstrip("x")) > 2.0, r  # fewer steps across hosts
    p = tmp_path / "fit.json"
    p.write_text(model.Params(shm=model.Link(1e-6, 1e-10), tcp=model.Link(1e-4, 1e-9)).to_json())
    out = subprocess.run([sys.executable, "-m", "ringreduce.model", "--params", str(p), "--layout", "2x2",
                          "--size", "64M"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[0] == "64MiB" and last[-1] == "hierarchical", out.stdout
    bad = subprocess.run([sys.executable, "-m", "ringreduce.model", "--params", str(tmp_path / "none.json")],
                         capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "cannot read the fit" in bad.stderr


def test_the_benchmark_report_from_saved_measurements(tmp_path):
    truth = model.Params(shm=model.Link(alpha=5e-6, beta=1 / 6e9), tcp=model.Link(alpha=7e-5, beta=1 / 1e9),
                         cores=os.cpu_count() or 2)
    sizes = [1 << 10, 1 << 20, 1 << 26]
    results = {}
    for hosts, per_host in ((1, 2), (2, 1), (2, 2)):
        rows = []
        for nb in sizes:
            t = {"ring": model.predict(truth, "ring", hosts, per_host, nb, ranks_sharing=hosts * per_host),
                 "gloo": 2e-3 + nb / 5e8}
            if hosts > 1 and per_host > 1:
                t["hierarchical"] = model.predict(truth, "hierarchical", hosts, per_host, nb,
                                                  ranks_sharing=hosts * per_host)
            rows.append({"bytes": nb, "rounds": 3, "per_round": 1, "time": t})
        results[f"{hosts}x{per_host}"] = {
            "layout": [hosts, per_host], "rows": rows, "where": [], "algorithms": "(synthetic)",
            "config": {"transport": "auto", "tcp_sockets": 2, "slice_bytes": 131072, "slots": 4},
            "torch": "synthetic"}
    saved = tmp_path / "run.json"
    saved.write_text(json.dumps({"link": {"bandwidth": 1.25e9, "streamed": 1e9, "latency": 3e-5, "bytes": 1 << 26, "reps": 5,
                                          "runs": [1.2e9, 1.25e9]}, "results": results}))
    fit = tmp_path / "fit.json"
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "tcp_netns.py"), "--report", str(saved),
                          "--model-out", str(fit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    # 2x1 at 64 MiB: busbw = M / t over a 1.25 GB/s link.
    t = results["2x1"]["rows"][-1]["time"]
    m = re.search(r"^# 64MiB 2x1: ringreduce busbw = (\d+)% of the link \(gloo (\d+)%\)$", text, re.M)
    assert m, text
    assert int(m.group(1)) == round((1 << 26) / t["ring"] / 1.25e9 * 100)
    assert int(m.group(2)) == round((1 << 26) / t["gloo"] / 1.25e9 * 100)
    m = re.search(r"^# 64MiB 2x1: ringreduce busbw = (\d+)% of the link streamed \(gloo (\d+)%\)$", text, re.M)
    assert m and int(m.group(1)) == round((1 << 26) / t["ring"] / 1e9 * 100), text
    t = results["2x2"]["rows"][-1]["time"]
    m = re.search(r"^# 64MiB 2x2: hierarchical = ([\d.]+)x flat ring$", text, re.M)
    assert m and float(m.group(1)) == pytest.approx(t["ring"] / t["hierarchical"], abs=0.006), text
    assert re.search(r"^# 1KiB 2x1: ringreduce time = [\d.]+ of gloo's$", text, re.M), text
    # The data came from the model, so the model refitted to it predicts it (the 2x2 points are
    # out of sample).
    m = re.search(r"^# model: worst error above 1 MiB = (\d+)% \((.+)\) over (\d+) points$", text, re.M)
    assert m and int(m.group(1)) <= 2 and int(m.group(3)) == 4, text
    kept = model.load(str(fit))
    assert kept.tcp.beta == pytest.approx(truth.tcp.beta, rel=0.02)

"""Tests of `python -m ringreduce.bench`: its arithmetic directly, its table through a subprocess.

The subprocess runs use tiny sizes and few iterations: they test the table, the check and the
launcher, not the numbers. The gloo,gloo runs exercise all of that without the compiled backend.
"""

import os
import re
import json
import subprocess
import sys

import pytest

import harness
import torch
import torch.distributed as dist

from ringreduce import bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["-b", "1K", "-e", "64K", "-n", "2", "-w", "1", "--timeout", "120"]
TINY_SIZES = [1024, 4096, 16384, 65536]


needs_ringreduce = harness.needs_ringreduce()


def run_bench(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "ringreduce.bench", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def parse_table(stdout):
    """(column names, rows as token lists) of the table in the bench's output."""
    lines = stdout.splitlines()
    columns = next(line for line in lines if line.startswith("#") and "size(B)" in line).lstrip("# ").split()
    rows = [line.split() for line in lines if line.strip() and not line.startswith("#")]
    return columns, rows


SET_COLUMNS = ["time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong"]
# The default table: per backend the native set's time and busbw, and #wrong over both sets.
BACKEND_COLUMNS = ["time(us)", "busbw(GB/s)", "#wrong"]
DEFAULT_COLUMNS = ["size(B)", "count", "type", "redop", *BACKEND_COLUMNS, "floor(us)", "%floor",
                   *BACKEND_COLUMNS, "ratio"]
FULL_COLUMNS = ["size(B)", "count", "type", "redop", *SET_COLUMNS * 2, "floor(us)", "%floor",
                *SET_COLUMNS * 2, "ratio"]
WIDTH = 120


def unwrap(stdout):
    """The output with the default layout's wrapped prose lines joined again: a continuation line is
    '#' and five or more spaces (the table's label lines are too, so parse the table from stdout)."""
    return re.sub(r"\n# {5,}(?=\S)", " ", stdout)


def assert_fits(stdout):
    """Every line of the default output in WIDTH characters (the path of --json's file aside)."""
    long = [line for line in stdout.splitlines() if len(line) > WIDTH and not line.startswith("# wrote ")]
    assert not long, "\n".join(long)


def _label_centres(line):
    """(label, centre column) of each label on one of the header's label lines."""
    return [(m.group(), (m.start() + m.end()) / 2) for m in re.finditer(r"\S+", line[1:])]


def parse_sets(stdout, full=True):
    """The table's rows as {(backend, set): {column: cell}}, from the two label lines above the
    column names (backends, then nccl-tests' out-of-place / in-place), placed by position: each
    column of a set belongs to the label centred nearest to it. The default table (full=False) labels
    one set per backend, over its time and busbw; its #wrong (both sets') goes under that set too."""
    lines = stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("#") and "size(B)" in line)
    names_line, backend_line, set_line = lines[at], lines[at - 2], lines[at - 1]
    columns = [(m.group(), (m.start() + m.end()) / 2 - 1) for m in re.finditer(r"\S+", names_line[1:])]
    backends, sets = _label_centres(backend_line), _label_centres(set_line)
    if full:
        assert {label for label, _ in sets} == {"out-of-place", "in-place"}, set_line
    else:
        assert [label for label, _ in sets] == ["in-place"] * len(backends), set_line
    per_set = SET_COLUMNS if full else BACKEND_COLUMNS

    def nearest(labels, x):
        return min(labels, key=lambda lc: abs(lc[1] - x))

    # Backends may share a name (gloo,gloo): number them in order.
    owner = []
    for name, x in columns:
        if name not in per_set:
            owner.append(None)
            continue
        b = nearest(backends, x)
        owner.append((f"{b[0]}#{backends.index(b)}", nearest(sets, x)[0], name))
    out = []
    for row in parse_table(stdout)[1]:
        cells = {}
        for key, cell in zip(owner, row, strict=True):
            if key is not None:
                cells.setdefault(key[:2], {})[key[2]] = cell
        out.append(cells)
    return out


def assert_table(stdout, dtype="float32", redop="sum", world=2, checked=True, full=False):
    """The table's structure (not its figures): by default the 120-column one, with full=True
    (--nccl-tests-columns) nccl-tests' column sets, as it always printed them."""
    columns, rows = parse_table(stdout)
    assert columns == (FULL_COLUMNS if full else DEFAULT_COLUMNS), columns
    assert [int(r[0]) for r in rows] == TINY_SIZES
    itemsize = bench.DTYPES[dtype].itemsize
    assert [int(r[1]) for r in rows] == [s // itemsize for s in TINY_SIZES]
    wrong = [i for i, c in enumerate(columns) if c == "#wrong"]
    # Two backends, each with nccl-tests' two sets (full) or with its wrong elements summed over them.
    assert len(wrong) == (4 if full else 2), columns
    for r in rows:
        assert len(r) == len(columns), (columns, r)
        assert r[2:4] == [dtype, redop]
        assert [r[i] for i in wrong] == (["0"] if checked else ["N/A"]) * len(wrong), (columns, r)
        assert float(r[columns.index("ratio")]) > 0
        floor_pct = r[columns.index("%floor")]
        if world == 1:
            assert floor_pct == "-"  # one rank moves nothing, so there is no floor to compare with
        else:
            assert float(floor_pct) >= 0
    if full:
        # Every backend has both sets, each with its four columns, under the labels nccl-tests uses.
        for cells in parse_sets(stdout):
            assert sorted(s for _, s in cells) == ["in-place", "in-place", "out-of-place", "out-of-place"], cells
            for figures in cells.values():
                assert list(figures) == SET_COLUMNS
                assert float(figures["time(us)"]) > 0 and float(figures["busbw(GB/s)"]) >= 0
        assert all(len(line) > WIDTH for line in stdout.splitlines() if line.startswith("# Timing: "))
        assert "# Columns: " not in stdout
    else:
        # Every backend has all_reduce's own set under its name, and the line above says what #wrong is.
        for cells in parse_sets(stdout, full=False):
            assert [s for _, s in cells] == ["in-place", "in-place"], cells
            for figures in cells.values():
                assert list(figures) == BACKEND_COLUMNS
                assert float(figures["time(us)"]) > 0 and float(figures["busbw(GB/s)"]) >= 0
        assert "# Columns: per backend the in-place set's time and busbw, and #wrong = the wrong elements of " \
            "both sets; --nccl-tests-columns prints" in unwrap(stdout)
        assert_fits(stdout)
    stdout = unwrap(stdout)
    assert "# 1KiB: " in stdout and "# 64KiB: " in stdout  # the summary lines
    assert re.search(r"^# 1KiB: .*, in-place\)$", stdout, re.M), stdout  # which set they use
    assert "# ratio = busbw(" in stdout and re.search(r"^# ratio = .*, in-place$", stdout, re.M)
    closing = closing_lines(stdout)
    assert closing["wrong"] == ("0 OK" if checked else "not checked (-c 0)")
    assert closing["busbw"] > 0


def closing_lines(stdout):
    """nccl-tests' two closing lines, parsed as scripts grep them."""
    wrong = re.search(r"^# Out of bounds values : (.*)$", stdout, re.M)
    busbw = re.search(r"^# Avg bus bandwidth    : ([\d.]+) $", stdout, re.M)
    assert wrong and busbw, stdout
    return {"wrong": wrong.group(1), "busbw": float(busbw.group(1))}


# --- the arithmetic --------------------------------------------------------------------------------


@pytest.mark.parametrize("world, factor", [(1, 1.0), (2, 1.0), (3, 4 / 3), (4, 1.5), (8, 1.75)])
def test_allreduce_busbw_factor(world, factor):
    assert bench.allreduce_busbw_factor(world) == pytest.approx(factor)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_ringreduce_allreduce_bytes_counts_one_input_read_and_one_output_write_per_rank(world):
    nbytes = world << 20
    assert bench.ringreduce_allreduce_bytes(nbytes, world) == world * (nbytes + nbytes)


def test_ringreduce_allreduce_bytes_single_rank_moves_nothing():
    assert bench.ringreduce_allreduce_bytes(1 << 20, 1) == 0


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_ringreduce_cuda_allreduce_bytes_counts_every_kernel_step_of_every_rank(world):
    """The ring's steps walked one by one, reads + writes in chunks of C = N/n, times n ranks."""
    chunk = 3 << 20
    nbytes = world * chunk
    per_rank = 2 * chunk  # reduce-scatter: input chunk -> successor's slot
    per_rank += (world - 2) * 3 * chunk  # slot + input -> next slot
    per_rank += 3 * chunk + 2 * chunk  # slot + input -> outgoing slot, then that slot -> output
    for s in range(1, world):  # all-gather: each chunk received
        per_rank += 2 * chunk + (2 * chunk if s < world - 1 else 0)  # -> output, and on unless last
    assert bench.ringreduce_cuda_allreduce_bytes(nbytes, world) == world * per_rank
    assert bench.ringreduce_cuda_allreduce_bytes(nbytes, world) == (7 * world - 5) * nbytes


def test_ringreduce_cuda_allreduce_bytes_figures():
    assert bench.ringreduce_cuda_allreduce_bytes(256 << 20, 2) == 9 * (256 << 20)
    assert bench.ringreduce_cuda_allreduce_bytes(256 << 20, 4) == 23 * (256 << 20)
    assert bench.ringreduce_cuda_allreduce_bytes(256 << 20, 1) == 0


@pytest.mark.parametrize("dtype", list(bench.DTYPES))
@pytest.mark.parametrize("redop", list(bench.REDOPS))
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_check_inputs_reduce_exactly_in_every_dtype(dtype, redop, world):
    """Reducing the check inputs in the dtype itself, in either order, gives the float64 reference."""
    dt = bench.DTYPES[dtype]
    signed = dt.is_floating_point or dt.is_signed
    idx = torch.arange(1000)
    inputs = [bench.check_input(redop, signed, world, r, idx).to(dt) for r in range(world)]
    combine = bench._COMBINE[redop]
    want = bench.expected_result(redop, signed, world, idx)
    if redop == "avg":
        assert torch.equal(want, want.round()), "averages must be integers for the check to be exact"
        want = want * world
    for order in (inputs, inputs[::-1]):
        acc = order[0]
        for x in order[1:]:
            acc = combine(acc, x)
        assert torch.equal(acc.to(torch.float64), want)
    if world > 1:
        assert not torch.equal(inputs[0], inputs[1]), "ranks must contribute different values"


@pytest.fixture
def solo_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.mark.parametrize("redop", list(bench.REDOPS))
def test_check_counts_wrong_elements(solo_group, redop):
    # Alone in its group, all_reduce returns the rank's own input: right for a world of 1, wrong for
    # a claimed world of 2. The count spans two reference chunks.
    count = bench.CHECK_CHUNK + 3
    cpu = torch.device("cpu")
    assert bench.check_all_reduce(count, torch.float32, redop, solo_group, 0, 1, cpu) == 0
    assert bench.check_all_reduce(count, torch.float32, redop, solo_group, 0, 2, cpu) > count // 10


def test_parse_args_rejects_bad_options(capsys):
    for argv in (
        ["-d", "float8"],
        ["-b", "1X"],
        ["-b", "4K", "-e", "1K"],
        ["-f", "1"],
        ["-n", "0"],
        ["--backends", "gloo,"],
    ):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
        assert "error:" in capsys.readouterr().err


# --- the whole bench, in subprocesses --------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2])
def test_bench_table_gloo_standin(world):
    out = run_bench("--backends", "gloo,gloo", "-g", str(world), *TINY)
    assert out.returncode == 0, out.stderr
    assert f"# World: {world} rank(s)" in out.stdout
    assert "-z 0: the ops of a batch issued asynchronously, then all waited on" in unwrap(out.stdout)
    assert_table(out.stdout, world=world)


def test_bench_nccl_tests_columns_print_the_full_table():
    # nccl-tests' column sets, and the prose a line per sentence, as the table was before it fitted 120
    # columns; unchecked here too, so both layouts show #wrong's N/A.
    out = run_bench("--backends", "gloo,gloo", "-g", "2", "-c", "0", "--nccl-tests-columns", *TINY)
    assert out.returncode == 0, out.stderr
    assert "-z 0: the ops of a batch issued asynchronously, then all waited on" in out.stdout
    assert_table(out.stdout, checked=False, full=True)


def test_bench_check_off_reads_na_as_nccl_tests():
    out = run_bench("--backends", "gloo,gloo", "-g", "2", "-c", "0", *TINY)
    assert out.returncode == 0, out.stderr
    assert "# #wrong: not checked (-c 0)" in out.stdout
    assert_table(out.stdout, checked=False)


def test_bench_blocking_runs_and_says_so(tmp_path):
    path = tmp_path / "rows.json"
    out = run_bench("--backends", "gloo,gloo", "-g", "2", "-z", "1", *TINY, "--json", str(path))
    assert out.returncode == 0, out.stderr
    assert "-z 1: every op waited on before the next is issued" in unwrap(out.stdout)
    assert_table(out.stdout)
    assert json.loads(path.read_text())["blocking"] is True


def test_bench_table_gloo_standin_bfloat16_max():
    out = run_bench("--backends", "gloo,gloo", "-g", "2", "-d", "bfloat16", "-o", "max", *TINY)
    assert out.returncode == 0, out.stderr
    assert_table(out.stdout, dtype="bfloat16", redop="max")


@needs_ringreduce
def test_bench_table_ringreduce_beside_gloo():
    out = run_bench("-g", "2", *TINY)
    assert out.returncode == 0, out.stderr
    assert "# Backends: ringreduce, gloo," in out.stdout
    assert_table(out.stdout)
    assert re.search(r"^#\s+ringreduce\s+gloo$", out.stdout, re.M), out.stdout  # the backends' label line
    # What the fingerprint checks and the flight recorder cost, at the smallest and largest sizes.
    line = next(x for x in unwrap(out.stdout).splitlines() if x.startswith("# safety work"))
    assert re.search(r"1KiB [\d.]+ us vs [\d.]+ us without \([+-][\d.]+%\); 64KiB ", line), line


def test_bench_reports_the_failing_rank():
    # gloo cannot average integers, so both columns are unsupported and every rank raises.
    out = run_bench("--backends", "gloo,gloo", "-g", "2", "-o", "avg", "-d", "int32", *TINY)
    assert out.returncode == 1
    failed = re.search(r"rank (\d) exited with status 1", out.stderr)
    assert failed, out.stderr
    assert f"--- traceback of rank {failed.group(1)} ---" in out.stderr
    assert "no backend runs all_reduce int32 avg" in out.stderr


def test_bench_deadline_stops_a_long_run():
    out = run_bench(
        "--backends", "gloo,gloo", "-g", "2", "-b", "64M", "-e", "64M", "-n", "100000", "--timeout", "5"
    )
    assert out.returncode == 124
    assert "timed out after 5 s" in out.stderr


def test_parse_args_device_cpu_by_default(capsys):
    args = bench.parse_args([])
    assert (args.device, args.nccl_floor) == ("cpu", False)
    with pytest.raises(SystemExit):
        bench.parse_args(["--nccl-floor"])
    assert "--nccl-floor needs --device cuda" in capsys.readouterr().err


def test_parse_args_cuda_without_gpu_fails_saying_why(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--device", "cuda"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: --device cuda needs a GPU, but torch.cuda.is_available() is False" in err, err


def test_parse_args_cuda_takes_the_nccl_floor_by_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench.parse_args(["--device", "cuda"]).nccl_floor is True
    assert bench.parse_args(["--device", "cuda", "--no-nccl-floor"]).nccl_floor is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="there is a GPU here, so --device cuda runs")
def test_bench_cuda_without_gpu_exits_with_one_clear_line():
    out = run_bench("--device", "cuda", "-g", "2")
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].endswith(
        f"error: --device cuda needs a GPU, but torch.cuda.is_available() is False "
        f"({'this torch is built without CUDA' if torch.version.cuda is None else 'no GPU is visible'}; "
        f"torch {torch.__version__})"
    ), out.stderr


# --- CUDA mode's report, from made-up GPU figures (no GPU needed) ----------------------------------

MiB = 1 << 20
COPY_BW = 3e12


def cuda_report(monkeypatch, world=2, argv=(), shared=True, kernel_bw=2.7e12):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = bench.parse_args(["--device", "cuda", *argv])
    args.command, args.threads = "python -m ringreduce.bench --device cuda", 1
    gpu = bench.Gpu(index=0, name="Made-up GPU", visible=1 if shared else 2, shared=shared,
                    copy_bytes=256 * MiB, copy_bw=COPY_BW, kernel_bw=kernel_bw,
                    kernel_note="" if kernel_bw else "ringreduce._C was built without CUDA: why")
    return bench.Report(args, world, bench.COLLECTIVES[args.op], COPY_BW,
                        [(None, None)] * len(args.backends), gpu)


def sets(time_s, wrong=0, out_of_place_s=None):
    """A backend's two sets at one size; out of place 1.5x the in-place time unless given."""
    return bench.SetResults(bench.Result(out_of_place_s or 1.5 * time_s, wrong), bench.Result(time_s, wrong))


def floor_cells(report, capsys, nbytes, time_s):
    # The floor and %floor are against the in-place time, all_reduce's own: the other set's must not count.
    report.row(nbytes, nbytes // 4, [sets(time_s, out_of_place_s=time_s / 3), sets(time_s * 10)])
    columns = report.column_names()
    cells = capsys.readouterr().out.split()
    return cells[columns.index("floor(us)")], cells[columns.index("%floor")]


@pytest.mark.parametrize("world, k", [(2, 9), (4, 23)])
def test_cuda_floor_is_all_ranks_traffic_through_one_gpu_at_its_copy_bw(monkeypatch, capsys, world, k):
    report = cuda_report(monkeypatch, world)
    report.header()
    header = capsys.readouterr().out
    assert_fits(header)
    header = unwrap(header)
    assert "# Device: cuda:0, Made-up GPU;" in header
    assert f"# Copy bandwidth: {COPY_BW / 1e9:.2f} GB/s device to device" in header
    floor_line = (f"  {world} rank(s) x {k}*N/{world} bytes each through one GPU's memory = {k}*N "
                  "at 3000.00 GB/s")
    assert floor_line in header, header
    assert "= 90.0% of the copy bandwidth" in header, header  # the kernel at 90% of the copy
    floor_us = k * 256 * MiB / COPY_BW * 1e6
    floor, pct = floor_cells(report, capsys, 256 * MiB, 2 * floor_us / 1e6)
    assert float(floor) == pytest.approx(floor_us, abs=0.05)
    assert float(pct) == pytest.approx(50.0)


def test_cuda_floor_not_applicable(monkeypatch, capsys):
    # No CUDA model for other collectives; none either when the ranks are on several GPUs.
    for report, why in (
        (cuda_report(monkeypatch, argv=["--op", "reduce_scatter"]), "no byte model of ringreduce's"),
        (cuda_report(monkeypatch, shared=False), "the ranks are on 2 GPUs"),
    ):
        report.header()
        assert f"# Memory floor: N/A ({why}" in unwrap(capsys.readouterr().out)
        assert floor_cells(report, capsys, 256 * MiB, 1e-3) == ("N/A", "N/A")


@pytest.mark.parametrize("full", [False, True])
def test_row_cells_in_both_layouts(monkeypatch, capsys, full):
    """The default row has each backend's native-set time and busbw and the wrong elements of both
    sets summed; --nccl-tests-columns has every set's four figures. N/A where nothing was measured
    or checked; a set not measured (alltoall's in-place) leaves its wrong elements out of the sum."""
    report = cuda_report(monkeypatch, argv=["--nccl-tests-columns"] if full else [])
    unmeasured = bench.SetResults(bench.Result(2e-3, 1), bench.Result(None, None))
    unchecked = bench.SetResults(bench.Result(3e-3, None), bench.Result(2e-3, None))
    rows = [(4 * MiB, MiB, [sets(1e-3, wrong=2), sets(2e-3)]), (4 * MiB, MiB, [unmeasured, unchecked])]
    for row in rows:
        report.row(*row)
    out = capsys.readouterr().out.splitlines()
    assert report.column_names() == (FULL_COLUMNS if full else DEFAULT_COLUMNS)
    assert all(len(line.split()) == len(report.column_names()) for line in out), out
    cells = [dict(zip(report.column_names(), line.split(), strict=True)) for line in out]  # the last of a name
    figures = [[line.split()[i] for i, c in enumerate(report.column_names()) if c in SET_COLUMNS] for line in out]
    if full:  # out-of-place, then in-place, per backend
        assert figures[0] == ["1500.0", "2.80", "2.80", "2", "1000.0", "4.19", "4.19", "2",
                              "3000.0", "1.40", "1.40", "0", "2000.0", "2.10", "2.10", "0"]
        assert figures[1] == ["2000.0", "2.10", "2.10", "1", "N/A", "N/A", "N/A", "N/A",
                              "3000.0", "1.40", "1.40", "N/A", "2000.0", "2.10", "2.10", "N/A"]
    else:  # in-place time and busbw, then both sets' wrong elements
        assert figures[0] == ["1000.0", "4.19", "4", "2000.0", "2.10", "0"]
        assert figures[1] == ["N/A", "N/A", "1", "2000.0", "2.10", "N/A"]
    assert cells[0]["ratio"] == "2.00" and cells[1]["ratio"] == "N/A"
    assert all(len(line) <= WIDTH for line in out) != full


def test_default_table_labels_the_native_set(monkeypatch, capsys):
    # all_gather is out of place in torch.distributed: the default table shows that set.
    report = cuda_report(monkeypatch, argv=["--op", "all_gather"])
    report.header()
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].split() == ["#", "ringreduce", "gloo"], lines[-3:]
    assert lines[-2].split() == ["#", "out-of-place", "out-of-place"], lines[-3:]
    assert lines[-1].split()[1:] == DEFAULT_COLUMNS
    assert "# Columns: per backend the out-of-place set's time and busbw" in unwrap("\n".join(lines))
    assert_fits("\n".join(lines))


def test_cuda_kernel_line_says_why_it_was_not_measured(monkeypatch, capsys):
    cuda_report(monkeypatch, kernel_bw=None).header()
    out = unwrap(capsys.readouterr().out)
    assert "# Kernel: ringreduce's reduction kernel not measured (ringreduce._C was built without CUDA: " \
        "why)" in out


def headline_rows(latency_s, big_s, gloo_s):
    return [
        (8 * 1024, 2048, [sets(latency_s), sets(1e-3)]),
        (256 * MiB, 64 * MiB, [sets(big_s), sets(gloo_s)]),
    ]


def test_cuda_headline(monkeypatch, capsys):
    report = cuda_report(monkeypatch)
    floor_s = 9 * 256 * MiB / COPY_BW
    report.headline(headline_rows(20e-6, 1.5 * floor_s, 100 * floor_s))
    out = capsys.readouterr().out
    assert "= 1.50x the memory floor" in out, out
    assert "# 256MiB: ringreduce busbw = 66.7x gloo" in out
    assert "# 8KiB: ringreduce latency 20.0 us" in out
    assert "target" not in out and "met" not in out, out
    # Only at world size 2, and only the sizes the run has.
    cuda_report(monkeypatch, world=4).headline(headline_rows(20e-6, floor_s, 100 * floor_s))
    assert capsys.readouterr().out == ""
    report.headline(headline_rows(20e-6, floor_s, 100 * floor_s)[:1])
    out = capsys.readouterr().out
    assert "256MiB" not in out and "# 8KiB: ringreduce latency 20.0 us" in out


def test_cuda_nccl_floor_and_json(monkeypatch, capsys, tmp_path):
    report = cuda_report(monkeypatch)
    report.nccl_floor([(8192, 9e-6, 7e-6), (256 * MiB, None, 300e-6)], None)
    out = capsys.readouterr().out
    assert "# launch-overhead floor: NCCL all_reduce at world size 1" in out
    assert re.search(r"^#\s+size\(B\)\s+out-of-place\s+in-place$", out, re.M), out
    assert re.search(r"^#\s+8192\s+9\.0\s+7\.0$", out, re.M), out
    assert re.search(r"^#\s+268435456\s+N/A\s+300\.0$", out, re.M), out
    rows = headline_rows(20e-6, 1e-3, 1e-1)
    path = tmp_path / "cuda.json"
    report.write_json(rows, str(path))
    doc = json.loads(path.read_text())
    assert doc["device"]["type"] == "cuda" and doc["device"]["name"] == "Made-up GPU"
    assert doc["kernel_bandwidth_GBps"] == pytest.approx(2700)
    assert doc["nccl_floor"]["set"] == "in-place"
    assert doc["nccl_floor"]["rows"][0] == {"bytes": 8192, "time_us": pytest.approx(7.0),
                                            "out_of_place": {"time_us": pytest.approx(9.0)},
                                            "in_place": {"time_us": pytest.approx(7.0)}}
    assert doc["nccl_floor"]["rows"][1]["out_of_place"] == {"time_us": None}
    assert {r["device"] for r in doc["rows"]} == {"cuda"}
    # Both sets of every row; the top-level figures are the in-place ones, all_reduce's own.
    first = doc["rows"][0]
    assert first["set"] == "in-place" and first["time_us"] == pytest.approx(20.0)
    assert first["in_place"]["time_us"] == pytest.approx(20.0)
    assert first["out_of_place"]["time_us"] == pytest.approx(30.0)
    capsys.readouterr()
    report.nccl_floor(None, "this torch has no NCCL")
    assert capsys.readouterr().out == "# NCCL floor: not measured (this torch has no NCCL)\n"
    report.write_json(rows, str(path))
    assert json.loads(path.read_text())["nccl_floor"] == {"not_measured": "this torch has no NCCL"}


def test_parse_args_defaults_and_check_switch():
    args = bench.parse_args([])
    assert (args.minbytes, args.maxbytes, args.stepfactor, args.iters, args.warmup) == (
        1024,
        64 << 20,
        4,
        20,
        5,
    )
    assert (args.dtype, args.redop, args.op, args.backends, args.check) == (
        "float32",
        "sum",
        "all_reduce",
        ["ringreduce", "gloo"],
        True,
    )
    assert bench.parse_args(["--no-check"]).check is False
    assert bench.parse_args(["--no-check", "-c"]).check is True
    # nccl-tests' spelling: -c 0|1, and -z 0|1 (blocking, off by default).
    assert bench.parse_args(["-c", "0"]).check is False
    assert bench.parse_args(["-c", "0", "-c", "1"]).check is True
    assert args.blocking is False
    assert bench.parse_args(["-z", "1"]).blocking is True
    assert bench.parse_args(["-z", "0"]).blocking is False


@pytest.mark.parametrize("argv", [["-c", "2"], ["-z", "yes"], ["-z"]])
def test_parse_args_takes_0_or_1(argv, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("op", sorted(bench.COLLECTIVES))
def test_bench_every_op_checks_and_writes_json(op, tmp_path):
    path = tmp_path / "rows.json"
    out = run_bench("-g", "2", "--op", op, *TINY, "--json", str(path))
    assert out.returncode == 0, out.stderr
    rows = json.loads(path.read_text())["rows"]
    _, table = parse_table(out.stdout)
    # One record per size and backend, each exactly checked, matching the printed table.
    assert len(rows) == 2 * len(table) and {r["backend"] for r in rows} == {"ringreduce", "gloo"}
    assert all(r["op"] == op and r["wrong"] == 0 and r["busbw_GBps"] > 0 for r in rows), rows
    # Both of nccl-tests' sets, each checked; the top-level figures are the set torch's call is.
    native = bench.COLLECTIVES[op].native_set
    assert {r["set"] for r in rows} == {native}
    for r in rows:
        assert r[native.replace("-", "_")]["time_us"] == r["time_us"]
        for key in ("out_of_place", "in_place"):
            if key == "in_place" and op == "alltoall":
                assert r[key] == {"time_us": None, "algbw_GBps": None, "busbw_GBps": None, "wrong": None}
            else:
                assert r[key]["wrong"] == 0 and r[key]["busbw_GBps"] > 0, (key, r)
    assert_fits(out.stdout)
    if op == "alltoall":
        assert "# ringreduce in-place: not measured (all_to_all_single has no in-place form" in unwrap(out.stdout)


def test_bench_plot(tmp_path):
    path = tmp_path / "busbw.png"
    out = run_bench("-g", "2", *TINY, "--plot", str(path))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        # The optional extra is missing: the bench says so before running anything.
        assert out.returncode != 0 and "--plot needs matplotlib" in out.stderr, out.stderr
        return
    assert out.returncode == 0, out.stderr
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("zero_grad", ["none", "zeros"])
def test_ddp_step_benchmark_runs(backend, zero_grad):
    """benchmarks/ddp_step.py end to end on a small model: every setup timed, the ratio line,
    with gradients set to None between steps (torch's default) and zeroed in place."""
    if backend != "ringreduce":
        pytest.skip("the DDP benchmark compares ringreduce with gloo; nothing to stand in for")
    p = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "ddp_step.py"), "--hidden", "256",
                        "--width-in", "64", "--batch", "4", "--steps", "1", "--rounds", "2", "--warmup", "1",
                        "--zero-grad", zero_grad,
                        # A rank still running at its deadline prints every thread's stack.
                        "--timeout", "200"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-6000:]}"
    assert f"zero_grad(set_to_none={zero_grad == 'none'})" in p.stdout, p.stdout
    for setup in (r"ringreduce DDP ", r"ringreduce DDP, views", r"ringreduce DDP, overlap=(True|False)",
                  r"torch DDP / rr", r"torch DDP / gloo", r"no comm ", r"no comm, in step",
                  r"bare \+ all-reduce"):
        assert re.search(rf"^{setup}\s+[\d.]+\s+\d+\s+[\d.]+x", p.stdout, re.M), p.stdout
    assert re.search(r"lockstep: the bare model with a barrier before each step is [\d.]+ ms "
                     r"(slower|faster) than without", p.stdout), p.stdout
    assert re.search(r"ringreduce DDP: step = [\d.]+x torch DDP on gloo", p.stdout), p.stdout
    assert re.search(r"no wrapper: the bare model with its gradients all-reduced after backward is [\d.]+x "
                     r"torch DDP on gloo; ringreduce DDP's step is [\d.]+ ms (longer|shorter)", p.stdout), p.stdout
    assert re.search(r"overlap: ringreduce DDP's step \(overlap=True\) is [\d.]+ ms (shorter|longer) than "
                     r"with overlap=False", p.stdout), p.stdout


def test_nccl_tests_closing_lines(monkeypatch, capsys):
    # nccl-tests ends with these two lines, which scripts grep for: wrong elements summed over the
    # sizes (OK at 0), busbw averaged over the sizes; here for ringreduce, then gloo on a line.
    report = cuda_report(monkeypatch)
    # Over both sets, as nccl-tests averages its out-of-place and in-place figures.
    rows = [(1 << 20, 1 << 18, [sets(1e-3, out_of_place_s=4e-3), sets(2e-3)]),
            (4 << 20, 1 << 20, [sets(2e-3, out_of_place_s=2e-3), sets(8e-3, 3)])]
    report.nccl_lines(rows)
    out = capsys.readouterr().out.splitlines()
    busbw = ((1 << 20) / 1e-3 + (1 << 20) / 4e-3 + 2 * (4 << 20) / 2e-3) / 4 / 1e9  # world 2: factor 1
    assert out[0] == "# Out of bounds values : 0 OK", out
    assert out[1] == f"# Avg bus bandwidth    : {busbw:.4f} ", out
    # 3 wrong in each of gloo's sets at the larger size.
    assert out[2].startswith("# gloo: out of bounds values 6 FAILED; avg bus bandwidth "), out


# --- --launches N: every backend in N fresh launches, and the spread over them ---------------------

LAUNCH_SIZES = ["-b", "1K", "-e", "4K", "-n", "2", "-w", "1", "--min-time", "0", "--timeout", "120"]
SPREAD_COLUMNS = ["size(B)", "backend", "best(us)", "median(us)", "worst(us)", "busbw(GB/s)", "worst/best"]


def parse_spread(stdout):
    """{(bytes, backend): {column: float}} from the spread table in the bench's output."""
    columns, rows = parse_table(stdout)
    assert columns == SPREAD_COLUMNS, columns
    out = {}
    for r in rows:
        assert len(r) == len(columns), r
        out[(int(r[0]), r[1])] = {c: float(x) for c, x in zip(columns[2:], r[2:], strict=True)}
    return out


@pytest.mark.parametrize("argv", [["--launches", "0"], ["--launches", "-1"], ["--launches", "two"]])
def test_parse_args_refuses_launches_below_one(argv, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "--launches" in err, err
    assert bench.parse_args([]).launches == 1  # one launch unless asked: the table as it always was


def test_bench_launches_zero_exits_before_starting_anything():
    out = run_bench("--backends", "gloo,gloo", "--launches", "0", *LAUNCH_SIZES)
    assert out.returncode == 2 and out.stdout == "", out
    assert "error: --launches must be at least 1, got 0" in out.stderr, out.stderr


def test_bench_launches_refused_under_torchrun():
    # torchrun's ranks come from the environment: the job cannot relaunch them, so it says so.
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29555")
    out = subprocess.run([sys.executable, "-m", "ringreduce.bench", "--backends", "gloo,gloo", "--launches", "2",
                          *LAUNCH_SIZES], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout == "", out
    assert "--launches 2" in out.stderr and "a torchrun job cannot relaunch itself" in out.stderr, out.stderr


def test_parse_args_launches_leave_out_the_nccl_floor(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench.parse_args(["--device", "cuda", "--launches", "3"]).nccl_floor is False
    with pytest.raises(SystemExit):
        bench.parse_args(["--device", "cuda", "--launches", "3", "--nccl-floor"])
    assert "--nccl-floor runs with --launches 1 only" in capsys.readouterr().err


@needs_ringreduce
def test_bench_launches_prints_the_spread_and_every_launch_in_json(tmp_path):
    path = tmp_path / "launches.json"
    out = run_bench("-g", "2", "--launches", "2", *LAUNCH_SIZES, "--json", str(path))
    assert out.returncode == 0, out.stderr
    # The launches ran one backend each, alternating: ringreduce 1, gloo 1, ringreduce 2, gloo 2.
    ran = re.findall(r"launch (\d)/2 of (\w+), 2 rank\(s\)", out.stderr)
    assert ran == [("1", "ringreduce"), ("1", "gloo"), ("2", "ringreduce"), ("2", "gloo")], out.stderr
    assert_fits(out.stdout)
    assert "# Backends: ringreduce, gloo, each in 2 launches of its own" in unwrap(out.stdout)
    assert "# ratio = " not in out.stdout  # no ratio column in the spread table
    assert "# Columns: " not in out.stdout  # nor the default table's columns

    spread = parse_spread(out.stdout)
    assert sorted(spread) == [(n, b) for n in (1024, 4096) for b in ("gloo", "ringreduce")], spread
    for key, s in spread.items():
        assert 0 < s["best(us)"] <= s["median(us)"] <= s["worst(us)"], (key, s)
        # Printed to 0.1 us: worst/best from the printed times, to the rounding of both (0.05 us
        # each, which moves the ratio in proportion to it: a launch 19x the best once exceeded a
        # bound that did not scale with the ratio) and of the ratio itself (0.005).
        assert s["worst/best"] >= 1.0
        ratio = s["worst(us)"] / s["best(us)"]
        rounding = ratio * (0.06 / s["best(us)"] + 0.06 / s["worst(us)"])
        assert s["worst/best"] == pytest.approx(ratio, abs=0.011 + rounding)
        assert s["busbw(GB/s)"] >= 0
    for b in ("ringreduce", "gloo"):
        assert re.search(rf"^# {b}: spread over 2 launches: 1KiB worst/best = [\d.]+, 4KiB worst/best = [\d.]+$",
                         out.stdout, re.M), out.stdout
    assert closing_lines(out.stdout)["wrong"] == "0 OK"  # over every launch
    assert re.search(r"^# 1KiB: ringreduce latency = .*, in-place\)$", out.stdout, re.M), out.stdout

    doc = json.loads(path.read_text())
    launches = doc["launches"]
    assert [(x["launch"], x["backend"]) for x in launches] == [(1, "ringreduce"), (1, "gloo"),
                                                                (2, "ringreduce"), (2, "gloo")]
    for x in launches:
        assert [r["bytes"] for r in x["rows"]] == [1024, 4096]
        assert all(r["backend"] == x["backend"] and r["wrong"] == 0 and r["time_us"] > 0 for r in x["rows"])
    # The spread records are the table, from the launches' own times; "rows" holds the medians.
    for rec in doc["spread"]:
        times = [r["time_us"] for x in launches if x["backend"] == rec["backend"]
                 for r in x["rows"] if r["bytes"] == rec["bytes"]]
        assert rec["launches"] == 2 and rec["set"] == "in-place"
        assert rec["best_us"] == pytest.approx(min(times)) and rec["worst_us"] == pytest.approx(max(times))
        assert rec["median_us"] == pytest.approx(sum(times) / 2)
        s = spread[(rec["bytes"], rec["backend"])]
        assert s["median(us)"] == pytest.approx(rec["median_us"], abs=0.051)
    assert len(doc["rows"]) == 4 and all(r["wrong"] == 0 for r in doc["rows"])
    medians = {(r["bytes"], r["backend"]): r["time_us"] for r in doc["rows"]}
    assert all(medians[(r["bytes"], r["backend"])] == pytest.approx(r["median_us"]) for r in doc["spread"])


def made_up_launch(number, backend, times_s, wrong=0):
    rows = [(n, n // 4, [sets(t, wrong)]) for n, t in zip((1024, 64 * MiB), times_s, strict=True)]
    return bench.Launch(number=number, backend=backend, rows=rows, copy_bw=COPY_BW + number,
                        gpu=None, unsupported=(None, None))


def test_spread_of_made_up_launches(capsys, tmp_path):
    args = bench.parse_args(["--launches", "3", "--json", str(tmp_path / "spread.json")])
    args.command, args.threads = "python -m ringreduce.bench --launches 3", 1
    # ringreduce: 1 KiB in 10, 30, 20 us; gloo: 40, 40, 40 us. 64 MiB: 1, 1, 4 ms against 8 ms.
    launches = [made_up_launch(1, 0, (10e-6, 1e-3)), made_up_launch(1, 1, (40e-6, 8e-3)),
                made_up_launch(2, 0, (30e-6, 1e-3)), made_up_launch(2, 1, (40e-6, 8e-3), wrong=2),
                made_up_launch(3, 0, (20e-6, 4e-3)), made_up_launch(3, 1, (40e-6, 8e-3))]
    bench.Spread(args, 2, bench.COLLECTIVES["all_reduce"], launches).print()
    out = capsys.readouterr().out
    spread = parse_spread(out)
    assert spread[(1024, "ringreduce")] == {"best(us)": 10.0, "median(us)": 20.0, "worst(us)": 30.0,
                                            "busbw(GB/s)": 0.05, "worst/best": 3.0}
    assert spread[(1024, "gloo")]["worst/best"] == 1.0
    assert spread[(64 * MiB, "ringreduce")]["median(us)"] == 1000.0
    assert "# ringreduce: spread over 3 launches: 1KiB worst/best = 3.00, 64MiB worst/best = 4.00" in out
    assert "# gloo: spread over 3 launches: 1KiB worst/best = 1.00, 64MiB worst/best = 1.00" in out
    assert_fits(out)
    assert "in the order ringreduce 1, gloo 1, ringreduce 2, gloo 2, ..." in unwrap(out)
    assert "# Columns: " not in out
    # gloo's 2 wrong elements in each set at each size of its second launch are counted.
    assert "# gloo: out of bounds values 8 FAILED;" in out
    assert "# 64MiB: ringreduce busbw = 8x gloo" in out  # at the medians
    doc = json.loads((tmp_path / "spread.json").read_text())
    assert [(x["launch"], x["backend"]) for x in doc["launches"]] == [
        (n, b) for n in (1, 2, 3) for b in ("ringreduce", "gloo")]
    assert doc["copy_bandwidth_GBps"] == pytest.approx((COPY_BW + 2) / 1e9)  # the median launch's

"""The knob table (csrc/backend/knobs.h, as ringreduce._C.knobs()) against docs/knobs.md and the
INFO line's config: the page gives every knob with the table's default (and scope, where the page
has that column) and names no RINGREDUCE_* variable the table lacks."""

import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOC = os.path.join(ROOT, "docs", "knobs.md")


@pytest.fixture(scope="module")
def knobs():
    from ringreduce import load_extension
    return {k["name"]: k for k in load_extension().knobs()}


def _doc_rows():
    """{variable: {column: cell}} for every table row of docs/knobs.md that starts with a
    `RINGREDUCE_*` cell; cells without their markdown backticks."""
    rows = {}
    header = None
    with open(DOC) as f:
        for line in f:
            line = line.strip()
            if not line.startswith("|"):
                header = None
                continue
            cells = [c.strip().replace("`", "") for c in line.strip("|").split("|")]
            if header is None:
                header = cells
                continue
            m = re.fullmatch(r"RINGREDUCE_[A-Z0-9_]+", cells[0])
            if m:
                assert cells[0] not in rows, f"docs/knobs.md gives {cells[0]} twice"
                rows[cells[0]] = dict(zip(header, cells))
    return rows


def test_every_knob_is_documented_with_its_default(knobs):
    rows = _doc_rows()
    assert sorted(rows) == sorted(knobs), (
        f"in the table only: {sorted(set(knobs) - set(rows))}; "
        f"in docs/knobs.md only: {sorted(set(rows) - set(knobs))}")
    for name, k in knobs.items():
        assert "default" in rows[name], (name, rows[name])
        assert rows[name]["default"] == k["default"], (name, rows[name]["default"], k["default"])
        if "scope" in rows[name]:
            assert rows[name]["scope"] == k["scope"], (name, rows[name]["scope"], k["scope"])


def _cmake_options():
    """The RINGREDUCE_* cache variables and options that CMakeLists.txt declares."""
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        text = f.read()
    return (set(re.findall(r"option\((RINGREDUCE_[A-Z0-9_]+)\s", text))
            | set(re.findall(r"set\((RINGREDUCE_[A-Z0-9_]+)\s[^)]*\sCACHE\s", text)))


def test_the_page_names_no_other_knob(knobs):
    with open(DOC) as f:
        named = set(re.findall(r"RINGREDUCE_[A-Z0-9_]*[A-Z0-9]", f.read()))
    # The CMake cache options are -D options, not environment variables (the page says so).
    named -= _cmake_options()
    assert named <= set(knobs), sorted(named - set(knobs))


def test_the_table_is_well_formed(knobs):
    for name, k in knobs.items():
        assert re.fullmatch(r"RINGREDUCE_[A-Z0-9_]+", name), name
        assert k["kind"] in ("bytes", "count", "flag", "choice", "text"), k
        assert k["scope"] in ("agreed", "per rank", "per process", "build", "test"), k
        assert k["default"] and k["meaning"], k


def test_info_lists_the_knobs_and_flags_unknown_ones(knobs):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-m", "ringreduce.info", "--knobs"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    listed = [line.split()[0] for line in out.stdout.splitlines()]
    assert listed == list(knobs), out.stdout
    out = subprocess.run([sys.executable, "-m", "ringreduce.info"], capture_output=True, text=True,
                         timeout=120, env=dict(env, RINGREDUCE_SLICE_BYTE="64"))
    assert out.returncode == 0, out.stderr
    assert "not ringreduce knobs (ignored; see python -m ringreduce.info --knobs): RINGREDUCE_SLICE_BYTE" \
        in out.stdout, out.stdout


AGREED = {"RINGREDUCE_SLICE_BYTES": "4K", "RINGREDUCE_SLOTS": "3", "RINGREDUCE_SPIN_US": "7",
          "RINGREDUCE_YIELD_US": "11", "RINGREDUCE_TRANSPORT": "tcp", "RINGREDUCE_TCP_SOCKETS": "3",
          "RINGREDUCE_CHECK_FINGERPRINTS": "0", "RINGREDUCE_CUDA_SLICE_BYTES": "64K",
          "RINGREDUCE_CUDA_TRANSPORT": "staged", "RINGREDUCE_CUDA_WINDOW_BYTES": "128K",
          "RINGREDUCE_ALGO": "ring",
          "RINGREDUCE_WINDOW_BYTES": "0", "RINGREDUCE_FAKE_HOSTS": "0", "RINGREDUCE_STREAM": "stream",
          "RINGREDUCE_STREAM_BYTES": "1M", "RINGREDUCE_ASYNC_START_US": "13", "RINGREDUCE_SPIN_MAX_US": "17"}


def _rank_config(ctx):
    import torch
    b = ctx.group._get_backend(torch.device("cpu"))
    return (b.slice_bytes, b.slots, b.spin_us, b.transport, b.tcp_sockets, b.check_fingerprints,
            b.algorithm("allreduce", 64), b.stream, b.stream_bytes, b.async_start_us, b.spin_max_us)


def test_every_agreed_knob_travels_through_the_store(ranks, standin):
    """Rank 0 publishes Config::to_string() and the others read it back through the knobs'
    setters: a value of every agreed knob other than its default reaches every rank."""
    if standin:
        pytest.skip("ringreduce's knobs")
    assert set(AGREED) == {n for n, k in _knob_table().items() if k["scope"] == "agreed"}
    out = ranks(2, env=AGREED).run(_rank_config, timeout=60)
    assert list(out[0]) == list(out[1]) == [4096, 3, 7, "tcp", 3, False, "ring", "stream", 1 << 20,
                                            13, 17], out


def _knob_table():
    from ringreduce import load_extension
    return {k["name"]: k for k in load_extension().knobs()}


@pytest.mark.parametrize("name,value,message", [
    ("RINGREDUCE_SLOTS", "1", "RINGREDUCE_SLOTS=1 must be between 2 and 64"),
    ("RINGREDUCE_SLICE_BYTES", "12Q", "RINGREDUCE_SLICE_BYTES=12Q is not a byte count"),
    ("RINGREDUCE_CUDA_TRANSPORT", "x", "RINGREDUCE_CUDA_TRANSPORT=x must be auto, ipc or staged"),
    ("RINGREDUCE_ALGO", "fast", "RINGREDUCE_ALGO"),
    ("RINGREDUCE_STREAM", "yes", "RINGREDUCE_STREAM=yes must be auto, plain or stream"),
    ("RINGREDUCE_TRANSPORT", "ib", "RINGREDUCE_TRANSPORT=ib is not one of auto, shm, tcp"),
])
def test_a_bad_value_fails_naming_the_variable(tmp_path, standin, name, value, message):
    if standin:
        pytest.skip("ringreduce's knobs")
    code = ("import torch.distributed as dist, ringreduce\n"
            f"store = dist.FileStore({str(tmp_path / 'store')!r}, 1)\n"
            "try:\n"
            "    dist.init_process_group('ringreduce', store=store, rank=0, world_size=1)\n"
            "except Exception as e:\n"
            "    print('FAILED:', e)\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               **{name: value})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=env)
    assert "FAILED:" in out.stdout and message in out.stdout, (out.stdout, out.stderr)


def _rank_crowding(ctx):
    import torch
    b = ctx.group._get_backend(torch.device("cpu"))
    return [], {"local": str(b.local_ranks), "spin": str(b.spin_us), "slice": str(b.slice_bytes)}


def test_crowded_core_defaults_count_the_ranks_on_rank0s_machine(ranks, standin):
    """The defaults for ranks that outnumber cores (short spin, long yield, large slices) follow
    the ranks that share rank 0's machine, not the group's size: 4 ranks cut into 2 fake hosts of
    2 count as 2 per machine (a core each on 2 cores), 4 ranks on one machine as 4."""
    if standin:
        pytest.skip("ringreduce's knobs")
    if (os.cpu_count() or 0) not in (2, 3):
        pytest.skip("needs a machine with 2 or 3 CPUs: 4 ranks crowd it, 2 do not")
    one = ranks(4).run(_rank_crowding, timeout=60)
    two = ranks(4, env={"RINGREDUCE_FAKE_HOSTS": "2"}).run(_rank_crowding, timeout=60)
    for _, d in one:
        assert (d["local"], d["spin"], d["slice"]) == ("4", "1", str(512 << 10)), one
    for _, d in two:
        assert (d["local"], d["spin"], d["slice"]) == ("2", "50", str(128 << 10)), two


def test_a_misspelled_knob_is_named_with_the_closest_one(tmp_path, standin):
    if standin:
        pytest.skip("ringreduce's knobs")
    code = ("import torch.distributed as dist, ringreduce\n"
            f"store = dist.FileStore({str(tmp_path / 'store')!r}, 1)\n"
            "dist.init_process_group('ringreduce', store=store, rank=0, world_size=1)\n"
            "dist.new_group(backend='ringreduce')\n")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               RINGREDUCE_SLICE_BYTE="64", RINGREDUCE_SPIN_USS="3")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    for name, closest in (("RINGREDUCE_SLICE_BYTE", "RINGREDUCE_SLICE_BYTES"),
                          ("RINGREDUCE_SPIN_USS", "RINGREDUCE_SPIN_US")):
        want = f"{name} is not a ringreduce knob and is ignored; did you mean {closest}?"
        assert out.stderr.count(want) == 1, out.stderr  # once, though two groups were made


DIFFERING = r'''
import json, os
import torch
import torch.distributed as dist
if os.environ["RANK"] == "1":
    os.environ["RINGREDUCE_SLOTS"] = "8"
    os.environ["RINGREDUCE_ALGO"] = "ring"
dist.init_process_group("ringreduce")
slots = dist.group.WORLD._get_backend(torch.device("cpu")).slots
with open(os.path.join(os.environ["OUT"], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"slots": slots}, f)
# Rank 0 hosts the store (env://): it must not leave while rank 1 may still be reading from it.
dist.barrier()
dist.destroy_process_group()
'''


def test_a_rank_whose_agreed_knob_differs_from_rank0s_is_warned(tmp_path, standin):
    """The warning comes from the backend's construction (C++, printed on the rank's stderr)."""
    if standin:
        pytest.skip("ringreduce's knobs")
    import harness
    results, _, why = harness.launch_script_ranks(tmp_path, 2, DIFFERING, "differing", {})
    assert [results.get(r, {}).get("slots") for r in (0, 1)] == [4, 4], why  # rank 0's value is in force
    rank0, rank1 = why.split("--- rank 1 ---")
    assert "is not used" not in rank0.split("--- rank 0 ---")[-1], why
    for line in ("rank 1: RINGREDUCE_SLOTS=8 is not used: the group uses rank 0's value, slots=4",
                 "rank 1: RINGREDUCE_ALGO=ring is not used: the group uses rank 0's value, algo=auto"):
        assert rank1.count(line) == 1, why


def test_the_algorithm_list_the_knob_text_and_the_docs_agree(knobs):
    """One list of algorithms (csrc/common/algos.h, as ringreduce._C.algorithms()): RINGREDUCE_ALGO's
    text in the knob table and in docs/knobs.md names each of them, docs/algorithms.md's table
    is that list row for row, and info --algorithms prints them."""
    from ringreduce import load_extension
    algos = load_extension().algorithms()
    names = [a["name"] for a in algos]
    assert names[:2] == ["auto", "ring"], names
    meaning = knobs["RINGREDUCE_ALGO"]["meaning"]
    doc_cell = " ".join(_doc_rows()["RINGREDUCE_ALGO"].values())
    for n in names:
        assert re.search(rf"\b{n}\b", meaning), (n, meaning)
        assert re.search(rf"\b{n}\b", doc_cell), (n, doc_cell)
    # Neither names an algorithm the list lacks: every word of the knob text's list is a name.
    listed = re.findall(r"\b([a-z]+)\b(?=,| or |$| \()", meaning)
    assert set(listed) <= set(names), (listed, names)

    rows = []
    with open(os.path.join(ROOT, "docs", "algorithms.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| `") and len(cells) == 3:
                rows.append({"name": cells[0].strip("`"), "what": cells[1], "serves": cells[2]})
    assert rows == [{"name": a["name"], "what": a["what"], "serves": a["serves"]} for a in algos], rows

    out = subprocess.run([sys.executable, "-m", "ringreduce.info", "--algorithms"], capture_output=True,
                         text=True, check=True, cwd=ROOT).stdout.splitlines()
    assert [line.split()[0] for line in out] == names, out


def test_the_transport_list_the_knob_text_and_the_docs_agree(knobs):
    """One list of transports (transport/registry.h, as ringreduce._C.transports()): shared memory
    first (the group's control), and RINGREDUCE_TRANSPORT's text in the knob table and in
    docs/knobs.md names each of them."""
    from ringreduce import load_extension
    names = [t["name"] for t in load_extension().transports()]
    assert names[0] == "shm" and load_extension().transports()[0]["same_host"], names
    meaning = knobs["RINGREDUCE_TRANSPORT"]["meaning"]
    doc_cell = " ".join(_doc_rows()["RINGREDUCE_TRANSPORT"].values())
    for n in names:
        assert re.search(rf"\b{n}\b", meaning), (n, meaning)
        assert re.search(rf"\b{n}: ", doc_cell), (n, doc_cell)


def _rank_spin(ctx):
    import torch
    b = ctx.group._get_backend(torch.device("cpu"))
    return b.spin_us, b.spin_max_us


@pytest.mark.parametrize("world,env,want", [
    (2, {}, "default"),
    (4, {}, "default"),
    (2, {"RINGREDUCE_SPIN_US": "7"}, (7, 7)),
    (2, {"RINGREDUCE_SPIN_US": "7", "RINGREDUCE_SPIN_MAX_US": "300"}, (7, 300)),
])
def test_the_spin_adapts_only_with_a_core_per_rank_and_no_spin_set_alone(ranks, standin, world, env, want):
    """The spin grows up to RINGREDUCE_SPIN_MAX_US (1000 us) with a core per rank; with more ranks
    than CPUs it stays at its 1 us, and a RINGREDUCE_SPIN_US set alone stays as set."""
    if standin:
        pytest.skip("ringreduce's knobs")
    if want == "default":
        want = (50, 1000) if len(os.sched_getaffinity(0)) >= world else (1, 1)
    out = ranks(world, env=env).run(_rank_spin, timeout=60)
    assert all(tuple(o) == want for o in out), out

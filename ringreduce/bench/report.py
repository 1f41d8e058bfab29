"""The output, on rank 0: the table as rows arrive, the summary lines, JSON and the plot."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import textwrap
from collections.abc import Callable

import torch

from ringreduce import _launch

from .collectives import PROG, SETS, Collective
from .cuda import GPU_REPS, KERNEL_BYTES, Gpu
from .floor import COPY_TRIALS, copy_bytes
from ..sizes import format_size
from .timing import SAFETY_ROUNDS, Result, SetResults

# The headline sizes of the CUDA summary (ranks sharing one GPU, world size 2): a large op against
# the memory floor and gloo, and a small one's latency.
HEADLINE_LARGE_BYTES = 256 << 20
HEADLINE_SMALL_BYTES = 8 << 10


# The width the default output keeps to: the table's lines and the prose around it, cut at spaces.
# --nccl-tests-columns prints nccl-tests' full table, and the prose on a line per sentence, as before.
WIDTH = 120


def comment(text: str, wrap: bool = True) -> str:
    """`text` as '# text' lines: with `wrap`, cut at spaces into lines of at most WIDTH characters,
    each continuation indented four spaces past the text's own indent (a long word stays whole)."""
    if not wrap or len(text) + 2 <= WIDTH:
        return f"# {text}"
    indent = " " * (len(text) - len(text.lstrip(" ")) + 4)
    return "\n".join("# " + part for part in textwrap.wrap(
        text, WIDTH - 2, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False))


def _fmt(value: float | None, spec: str) -> str:
    return "N/A" if value is None else format(value, spec)


def _us(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6


class Report:
    """Prints the table as rows arrive, so a long run shows progress."""

    def __init__(
        self,
        args: argparse.Namespace,
        world: int,
        coll: Collective,
        copy_bw: float,
        unsupported: list,
        gpu: Gpu | None,
    ):
        self.args, self.world, self.coll, self.copy_bw, self.unsupported, self.gpu = (
            args,
            world,
            coll,
            copy_bw,
            unsupported,
            gpu,
        )
        # The memory floor's byte model (bytes, world) -> bytes, or None and why there is none.
        self.floor_bytes, self.no_floor = coll.floor_bytes, ""
        if gpu is not None:
            self.floor_bytes = coll.cuda_floor_bytes if gpu.shared else None
            if coll.cuda_floor_bytes is None:
                self.no_floor = f"no byte model of ringreduce's {coll.name} on CUDA"
            elif not gpu.shared:
                self.no_floor = (
                    f"the ranks are on {min(world, gpu.visible)} GPUs and the model is of one GPU's memory; "
                    "CUDA_VISIBLE_DEVICES=<one GPU> puts them all on one"
                )
        self.nccl: tuple | None = None  # nccl_floor's result, once measured
        self.names = args.backends
        # The set whose figures the floor, the ratio and the summary lines use: the collective's own
        # form in torch.distributed, which is what this table measured before it had both sets.
        self.native = coll.native_in_place
        # --nccl-tests-columns: both sets' time, algbw, busbw and #wrong per backend, as nccl-tests
        # prints them (about 250 characters for two backends). By default, the native set's time and
        # busbw and the wrong elements of both sets summed: two backends in under 120 characters.
        self.full = args.nccl_tests_columns
        # The columns as (backend index, set index, name, width), -1 where a column has no backend
        # or set: the two label lines above the names span the runs of equal indices.
        if self.full:
            per_backend = [(s, c, w) for s in range(len(SETS))
                           for c, w in (("time(us)", 10), ("algbw(GB/s)", 11), ("busbw(GB/s)", 11), ("#wrong", 7))]
            first = [("size(B)", 12), ("count", 12), ("type", 8), ("redop", 6)]
            floor, ratio = [("floor(us)", 10), ("%floor", 7)], ("ratio", 8)
        else:
            per_backend = [(int(self.native), "time(us)", 9), (int(self.native), "busbw(GB/s)", 11),
                           (-1, "#wrong", 6)]
            first = [("size(B)", 10), ("count", 10), ("type", 8), ("redop", 5)]
            floor, ratio = [("floor(us)", 9), ("%floor", 6)], ("ratio", 6)
        self.columns = [(-1, -1, c, w) for c, w in first]
        for i in range(len(self.names)):
            self.columns += [(i, s, c, w) for s, c, w in per_backend]
            if i == 0:
                self.columns += [(i, -1, c, w) for c, w in floor]
        if len(self.names) > 1:
            self.columns.append((-1, -1, *ratio))
        self.widths = [max(len(name), width) for _, _, name, width in self.columns]

    def column_names(self) -> list[str]:
        return [name for _, _, name, _ in self.columns]

    def _line(self, prefix: str, cells: list[str]) -> str:
        return prefix + " ".join(cell.rjust(w) for cell, w in zip(cells, self.widths, strict=True))

    def _label_line(self, key: Callable[[tuple], tuple], label: Callable[[tuple], str]) -> str:
        """Labels centred over the runs of columns with equal key(column)."""
        runs: list[list] = []  # [key, label, width]
        for col, w in zip(self.columns, self.widths, strict=True):
            if runs and runs[-1][0] == key(col):
                runs[-1][2] += w + 1
            else:
                runs.append([key(col), label(col), w])
        return "# " + " ".join(text.center(w) for _, text, w in runs).rstrip()

    def _busbw(self, nbytes: int, time_s: float) -> float:
        return nbytes / time_s / 1e9 * self.coll.busbw_factor(self.world)

    def _native(self, results: list[SetResults]) -> list[Result]:
        return [r.get(self.native) for r in results]

    def _floor_s(self, nbytes: int) -> float | None:
        """The memory floor of one op of `nbytes`, in seconds; None where there is no model."""
        return None if self.floor_bytes is None else self.floor_bytes(nbytes, self.world) / self.copy_bw

    def _floor_lines(self, subject: str) -> list[str]:
        a, n, bw = self.args, self.world, f"{self.copy_bw / 1e9:.2f} GB/s"
        native = SETS[self.native]
        if self.gpu is None:
            return [
                f"Memory floor: {n} rank(s) each copying {format_size(copy_bytes(a.maxbytes))} at once move "
                f"{bw} (reads + writes, all ranks together)",
                f"  {subject}'s {a.op} of N bytes reads + writes {self.coll.floor_formula} bytes in all => "
                f"floor(us) = {self.coll.floor_formula} / {bw}; %floor = floor / time({subject}, {native})",
            ]
        g = self.gpu
        lines = [
            f"Copy bandwidth: {bw} device to device (dst.copy_(src) of {format_size(g.copy_bytes)}, "
            f"best of {COPY_TRIALS} runs of {GPU_REPS} copies timed with CUDA events; reads + writes)"
        ]
        if g.kernel_bw is None:
            lines.append(f"Kernel: ringreduce's reduction kernel not measured ({g.kernel_note})")
        else:
            share = g.kernel_bw / g.copy_bw
            kb = format_size(KERNEL_BYTES)
            lines.append(
                f"Kernel: ringreduce's reduction kernel (_C.reduce_tensors, float32 sum of two {kb} "
                f"buffers into a third) moves {g.kernel_bw / 1e9:.2f} GB/s (3 x {kb} per call) = "
                f"{share * 100:.1f}% of the copy bandwidth"
            )
        if self.floor_bytes is None:
            lines.append(f"Memory floor: N/A ({self.no_floor})")
        else:
            # The model is linear in N: its bytes for N = 1 are the coefficient.
            k = self.floor_bytes(1, n)
            lines += [
                f"Memory floor: {subject}'s {a.op} of N bytes by the ring's kernels moves "
                f"{self.coll.cuda_floor_formula}/n bytes per rank through the GPU's memory (reads + writes, "
                "the ring's slots included; the stream-ordered one-shot moves more, (n+3)*N, so this "
                "floor is the stricter)",
                f"  {n} rank(s) x {k}*N/{n} bytes each through one GPU's memory = {k}*N at {bw} => "
                f"floor(us) = {k}*N / {bw}; %floor = floor / time({subject}, {native})",
            ]
        return lines

    def header(self) -> None:
        for line in self.header_lines():
            print(comment(line, not self.full))
        print("#")
        print(self._label_line(lambda c: (c[0],), lambda c: self.names[c[0]] if c[0] >= 0 else ""))
        print(self._label_line(lambda c: (c[0], c[1]), lambda c: SETS[c[1]] if c[1] >= 0 else ""))
        print(self._line("# ", self.column_names()), flush=True)

    def header_lines(self) -> list[str]:
        """What was run, how it was timed and what the columns mean, without the leading '# '.
        With --launches N > 1 the backends line says how the launches went, and the ratio line is
        left out (the spread table has no ratio column)."""
        a, n = self.args, self.world
        subject, baseline = self.names[0], self.names[1] if len(self.names) > 1 else None
        launch = (
            "launched by torchrun"
            if _launch.launched_by_torchrun()
            else f"spawned locally, {a.threads} intra-op thread(s) each"
        )
        lines = [
            f"{PROG}: {a.op}, {a.dtype}, redop {a.redop}",
            f"Command: {a.command}",
            f"Date: {datetime.datetime.now().isoformat(sep=' ', timespec='seconds')}",
            f"Host: {platform.node()}, {os.cpu_count()} CPUs, {platform.system()}-{platform.machine()}; "
            f"torch {torch.__version__}; Python {platform.python_version()}",
        ]
        if self.gpu is not None:
            g = self.gpu
            lines.append(
                f"Device: cuda:{g.index}, {g.name}; CUDA {torch.version.cuda}; {g.visible} GPU(s) visible, "
                f"rank r on GPU r % {g.visible}" + (", so every rank shares this one" if g.shared else "")
            )
        sync = "; CUDA: torch.cuda.synchronize() before every clock reading" if self.gpu is not None else ""
        if a.blocking:
            issue = "-z 1: every op waited on" + (" and synchronized" if self.gpu is not None else "") + \
                " before the next is issued"
        else:
            issue = "-z 0: the ops of a batch issued asynchronously, then all waited on, as nccl-tests does"
        native, other = SETS[self.native], SETS[not self.native]
        lines += [
            f"World: {n} rank(s), {launch}",
            f"Timing: at each size and set, {a.warmup} untimed iterations, a barrier, then {a.iters} timed "
            f"ones or as many more as last {a.min_time:g} s (the same count on every rank); {issue}; "
            f"time = max over ranks of the mean iteration time{sync}",
            self._backends_line(),
            f"Sets: out-of-place puts the result in a buffer of its own, in-place in the input's, as in "
            f"nccl-tests; {a.op} is {native} in torch.distributed; {other}: {self.coll.other_set}",
            f"algbw = size / time, busbw = algbw * {self.coll.busbw_formula} "
            f"({n} ranks: x{self.coll.busbw_factor(n):.3f}); GB = 1e9 bytes",
            *self._floor_lines(subject),
        ]
        if baseline and a.launches == 1:
            lines.append(f"ratio = busbw({subject}) / busbw({baseline}) = time({baseline}) / "
                         f"time({subject}), {native}")
        for name, reasons in zip(self.names, self.unsupported, strict=True):
            if reasons[0] and reasons[0] == reasons[1]:
                lines.append(f"{name}: not measured ({reasons[0]})")
                continue
            lines += [f"{name} {set_name}: not measured ({reason})"
                      for set_name, reason in zip(SETS, reasons, strict=True) if reason]
        if not self.full and a.launches == 1:  # the spread table has columns of its own
            lines.append(f"Columns: per backend the {native} set's time and busbw, and #wrong = the wrong elements "
                         "of both sets; --nccl-tests-columns prints both sets' time, algbw, busbw and #wrong")
        if not a.check:
            lines.append("#wrong: not checked (-c 0)")
        return lines

    def _backends_line(self) -> str:
        a, names = self.args, self.names
        if a.launches == 1:
            return (f"Backends: {', '.join(names)}, alternating at each size; "
                    "barriers and bookkeeping on a separate gloo group")
        order = ", ".join(f"{name} {i}" for i in (1, 2) for name in names) + (", ..." if a.launches > 2 else "")
        return (f"Backends: {', '.join(names)}, each in {a.launches} launches of its own (fresh processes, "
                f"fresh rendezvous), every launch measuring every size, in the order {order}; "
                "barriers and bookkeeping on a separate gloo group")

    def _set_cells(self, nbytes: int, r: Result) -> list[str]:
        measured = r.time_s is not None
        return [
            _fmt(r.time_s * 1e6 if measured else None, ".1f"),
            _fmt(nbytes / r.time_s / 1e9 if measured else None, ".2f"),
            _fmt(self._busbw(nbytes, r.time_s) if measured else None, ".2f"),
            "N/A" if r.wrong is None else str(r.wrong),
        ]

    @staticmethod
    def _wrong_cell(sets: SetResults) -> str:
        """The wrong elements of the sets measured, summed; N/A where none was measured or checked."""
        wrongs = [r.wrong for r in sets.both() if r.time_s is not None]
        return "N/A" if not wrongs or None in wrongs else str(sum(wrongs))

    def row(self, nbytes: int, count: int, results: list[SetResults]) -> None:
        a = self.args
        cells = [str(nbytes), str(count), a.dtype, a.redop]
        for i, sets in enumerate(results):
            if self.full:
                for r in sets.both():
                    cells += self._set_cells(nbytes, r)
            else:
                time_cell, _, busbw_cell, _ = self._set_cells(nbytes, sets.get(self.native))
                cells += [time_cell, busbw_cell, self._wrong_cell(sets)]
            if i == 0:
                r = sets.get(self.native)
                floor_s = self._floor_s(nbytes)
                if floor_s is None:
                    cells += ["N/A", "N/A"]
                else:
                    cells.append(f"{floor_s * 1e6:.1f}")
                    cells.append(
                        "-" if floor_s == 0 or r.time_s is None else f"{floor_s / r.time_s * 100:.1f}"
                    )
        if len(results) > 1:
            cells.append(_fmt(self._ratio(results), ".2f"))
        print(self._line("  ", cells), flush=True)

    def _set_record(self, nbytes: int, r: Result) -> dict:
        measured = r.time_s is not None
        return {
            "time_us": r.time_s * 1e6 if measured else None,
            "algbw_GBps": nbytes / r.time_s / 1e9 if measured else None,
            "busbw_GBps": self._busbw(nbytes, r.time_s) if measured else None,
            "wrong": r.wrong,
        }

    def records(self, rows: list, names: list[str] | None = None) -> list[dict]:
        """One dict per (size, backend): what the table shows, in plain units. Each set has its own
        figures under "out_of_place" and "in_place"; the top-level figures are the native set's
        (named by "set"), as the records had them before there were two sets. `names`: the backends
        of `rows`, when not all of the run's (one launch of --launches)."""
        out = []
        for nbytes, count, results in rows:
            for name, sets in zip(names or self.names, results, strict=True):
                out.append({
                    "op": self.args.op, "backend": name, "device": self.args.device, "world": self.world,
                    "bytes": nbytes, "count": count, "dtype": self.args.dtype, "redop": self.args.redop,
                    "set": SETS[self.native],
                    **self._set_record(nbytes, sets.get(self.native)),
                    "out_of_place": self._set_record(nbytes, sets.out_of_place),
                    "in_place": self._set_record(nbytes, sets.in_place),
                })
        return out

    def write_json(self, rows: list, path: str, extra: dict | None = None) -> None:
        """The run as JSON: `rows`' records and what the header says; `extra`'s keys added."""
        doc = {
            "command": " ".join(shlex.quote(a) for a in sys.argv),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "host": {"cpus": os.cpu_count(), "torch": torch.__version__},
            "copy_bandwidth_GBps": self.copy_bw / 1e9,
            "device": {"type": "cpu"},
            "blocking": bool(self.args.blocking),
            "check": bool(self.args.check),
            "rows": self.records(rows),
        }
        if self.gpu is not None:
            g = self.gpu
            doc["device"] = {"type": "cuda", "index": g.index, "name": g.name, "cuda": torch.version.cuda,
                             "gpus_visible": g.visible, "ranks_share_it": g.shared}
            doc["kernel_bandwidth_GBps"] = None if g.kernel_bw is None else g.kernel_bw / 1e9
        if self.nccl is not None:
            times, why = self.nccl
            doc["nccl_floor"] = (
                {"op": self.args.op, "world": 1, "set": SETS[self.native], "rows": [
                    {"bytes": n, "time_us": _us(sets[self.native]),
                     "out_of_place": {"time_us": _us(sets[0])}, "in_place": {"time_us": _us(sets[1])}}
                    for n, *sets in times]}
                if times is not None
                else {"not_measured": why}
            )
        doc.update(extra or {})
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"# wrote {path}")

    def plot(self, rows: list, path: str) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise RuntimeError(f"{PROG}: --plot needs matplotlib ({e}): pip install matplotlib") from e
        fig, ax = plt.subplots(figsize=(7, 4.5))
        recs = self.records(rows)
        for i, name in enumerate(self.names):
            color = f"C{i}"
            for key, set_name, style in (("out_of_place", SETS[0], "--"), ("in_place", SETS[1], "-")):
                pts = [(r["bytes"], r[key]["busbw_GBps"]) for r in recs[i :: len(self.names)]
                       if r[key]["busbw_GBps"]]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=color, linestyle=style,
                            label=f"{name} {self.args.op} {set_name}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"{self.args.op}, {self.args.dtype} {self.args.redop}, {self.world} ranks")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        print(f"# wrote {path}")

    def _ratio(self, results: list[SetResults]) -> float | None:
        """busbw of the first backend over the second's, in the native set."""
        subject, baseline = (r.time_s for r in self._native(results[:2]))
        return None if subject is None or baseline is None else baseline / subject

    def safety(self, costs) -> None:
        parts = [f"{format_size(n)} {on * 1e6:.1f} us vs {off * 1e6:.1f} us without "
                 f"({(on / off - 1) * 100:+.1f}%)" for n, on, off in costs]
        print(comment(f"safety work (fingerprint check of every message + flight recorder), {SETS[self.native]}, "
                      f"medians of {SAFETY_ROUNDS} alternating runs: " + "; ".join(parts), not self.full), flush=True)

    def summary(self, rows: list) -> None:
        """nccl-tests' closing lines for the first backend (and one line per other backend), then
        latency at the smallest size and busbw at the largest against the second backend, in the
        native set."""
        self.nccl_lines(rows)
        if len(self.names) < 2 or any(reasons[self.native] for reasons in self.unsupported[:2]):
            return
        subject, baseline = self.names[:2]
        native = SETS[self.native]
        small, large = rows[0], rows[-1]
        speedup = self._ratio(small[2])
        latency = f"1/{speedup:.3g} of" if speedup >= 1 else f"{1 / speedup:.3g}x"
        t0, t1 = (r.time_s * 1e6 for r in self._native(small[2][:2]))
        size = format_size(small[0])
        print(f"# {size}: {subject} latency = {latency} {baseline} ({t0:.1f} us vs {t1:.1f} us, {native})")
        nbytes, _, results = large
        natives = self._native(results[:2])
        bw0, bw1 = (self._busbw(nbytes, r.time_s) for r in natives)
        floor_s = self._floor_s(nbytes)
        at_floor = f", {floor_s / natives[0].time_s * 100:.0f}% of the memory floor" if floor_s else ""
        print(
            f"# {format_size(nbytes)}: {subject} busbw = {self._ratio(results):.3g}x {baseline} "
            f"({bw0:.2f} vs {bw1:.2f} GB/s, {native}){at_floor}",
            flush=True,
        )

    def nccl_lines(self, rows: list) -> None:
        """`# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth : X`, as nccl-tests ends its
        output (scripts grep for them): the wrong elements summed over every size and both sets, and
        busbw averaged over every size and both sets (as nccl-tests averages its out-of-place and
        in-place figures), for the first backend; the other backends follow on a line each."""
        for i, name in enumerate(self.names):
            measured = [(nbytes, r) for nbytes, _, res in rows for r in res[i].both() if r.time_s is not None]
            if not measured:
                continue
            if not self.args.check:
                wrong = "not checked (-c 0)"
            else:
                n = sum(r.wrong or 0 for _, r in measured)
                wrong = f"{n} {'OK' if n == 0 else 'FAILED'}"
            busbw = statistics.fmean(self._busbw(nbytes, r.time_s) for nbytes, r in measured)
            if i == 0:
                print(f"# Out of bounds values : {wrong}")
                print(f"# Avg bus bandwidth    : {busbw:.4f} ")
            else:
                print(f"# {name}: out of bounds values {wrong}; avg bus bandwidth {busbw:.4f}")
        sys.stdout.flush()

    def headline(self, rows: list) -> None:
        """For ringreduce's all_reduce with its ranks on one GPU, at world size 2: a large op against
        the memory floor and gloo, and a small op's latency; in place, all_reduce's native set."""
        a = self.args
        if self.gpu is None or self.world != 2 or a.op != "all_reduce" or self.names[0] != "ringreduce":
            return
        subject = self.names[0]
        by_size = {nbytes: self._native(results) for nbytes, _, results in rows}
        size = format_size(HEADLINE_LARGE_BYTES)
        big = by_size.get(HEADLINE_LARGE_BYTES)
        if big is not None and big[0].time_s is not None:
            t = big[0].time_s
            floor_s = self._floor_s(HEADLINE_LARGE_BYTES)
            if floor_s:
                print(f"# {size}: {subject} {t * 1e6:.1f} us = {t / floor_s:.2f}x the memory floor "
                      f"({floor_s * 1e6:.1f} us)")
            gloo = big[self.names.index("gloo")] if "gloo" in self.names[1:] else None
            if gloo is not None and gloo.time_s is not None:
                print(f"# {size}: {subject} busbw = {gloo.time_s / t:.3g}x gloo")
        small = by_size.get(HEADLINE_SMALL_BYTES)
        if small is not None and small[0].time_s is not None:
            print(f"# {format_size(HEADLINE_SMALL_BYTES)}: {subject} latency {small[0].time_s * 1e6:.1f} us")
        sys.stdout.flush()

    def nccl_floor(self, times: list | None, why: str | None) -> None:
        """NCCL's own time at world size 1 on this GPU, in both sets: what launching any op costs,
        its floor. `times` holds (bytes, out-of-place seconds, in-place seconds), None for a set
        NCCL did not run."""
        self.nccl = (times, why)
        if times is None:
            print(f"# NCCL floor: not measured ({why})", flush=True)
            return
        print(f"# launch-overhead floor: NCCL {self.args.op} at world size 1 on the same GPU, in a process "
              "of its own (NCCL cannot put two ranks on one GPU), timed as the table is")
        print(f"# {'size(B)':>12} {'out-of-place':>14} {'in-place':>14}")
        print(f"# {'':>12} {'NCCL time(us)':>14} {'NCCL time(us)':>14}")
        for nbytes, *sets in times:
            print(f"# {nbytes:>12} " + " ".join(_fmt(_us(t), ".1f").rjust(14) for t in sets))
        sys.stdout.flush()

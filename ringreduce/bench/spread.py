"""--launches N > 1: the spread of each size's time over N fresh launches per backend (the parent).

Every launch is one spawn of the ranks that measures every size for one backend and hands rank 0's
rows back (cli.run_launches). Here they are gathered: per size and backend the best, median and
worst launch, busbw at the median, and worst/best; then nccl-tests' closing lines and the
comparison lines at the medians, as one run prints them, and JSON with every launch's rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass

from .collectives import SETS, Collective
from .cuda import Gpu
from .report import Report, comment
from ..sizes import format_size
from .timing import Result, SetResults

# The spread table's columns: (name, width).
COLUMNS = [("size(B)", 12), ("backend", 10), ("best(us)", 10), ("median(us)", 10), ("worst(us)", 10),
           ("busbw(GB/s)", 11), ("worst/best", 10)]


@dataclass
class Launch:
    """What rank 0 of one launch measured: one backend's rows, as _bench builds them."""

    number: int  # 1..N
    backend: int  # index into --backends
    rows: list  # (bytes, count, [SetResults]) per size, one backend
    copy_bw: float | None  # the memory floor's unit (the GPU's copy bandwidth with --device cuda)
    gpu: Gpu | None
    unsupported: tuple  # why each set (SETS' order) was not measured, None where it was


@dataclass
class SizeSpread:
    """One backend's times at one size in the native set, over its launches."""

    times: list[float]

    @property
    def best(self) -> float:
        return min(self.times)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def worst(self) -> float:
        return max(self.times)

    @property
    def worst_over_best(self) -> float:
        return self.worst / self.best


def _labels(names: list[str]) -> list[str]:
    """The backends' names, numbered where one is measured twice (gloo,gloo)."""
    return [name if names.count(name) == 1 else f"{name}#{i + 1}" for i, name in enumerate(names)]


class Spread:
    def __init__(self, args: argparse.Namespace, world: int, coll: Collective, launches: list[Launch]):
        self.args, self.world, self.coll = args, world, coll
        self.n = args.launches
        self.names = args.backends
        self.labels = _labels(self.names)
        self.by_backend = [[x for x in launches if x.backend == b] for b in range(len(self.names))]
        assert all(len(ls) == self.n for ls in self.by_backend), [len(ls) for ls in self.by_backend]
        self.sizes = [(nbytes, count) for nbytes, count, _ in launches[0].rows]
        bws = [x.copy_bw for x in launches if x.copy_bw is not None]
        self.copy_bws = bws
        gpu = next((x.gpu for x in launches if x.gpu is not None), None)
        unsupported = [ls[0].unsupported for ls in self.by_backend]
        self.report = Report(args, world, coll, statistics.median(bws) if bws else None, unsupported, gpu)
        self.native = coll.native_in_place

    def _set_over_launches(self, b: int, k: int, inplace: bool) -> Result:
        """Backend b's set at the k-th size: the median time over the launches and the wrong
        elements summed over them (None where any launch did not measure or did not check it)."""
        rs = [x.rows[k][2][0].get(inplace) for x in self.by_backend[b]]
        times = [r.time_s for r in rs]
        time_s = None if None in times else statistics.median(times)
        wrongs = [r.wrong for r in rs]
        return Result(time_s, None if None in wrongs else sum(wrongs))

    def median_rows(self) -> list:
        """The rows a single run would have had, each figure the median over the launches."""
        return [
            (nbytes, count, [SetResults(*(self._set_over_launches(b, k, inplace) for inplace in (False, True)))
                             for b in range(len(self.names))])
            for k, (nbytes, count) in enumerate(self.sizes)
        ]

    def spread(self, b: int, k: int) -> SizeSpread | None:
        """Backend b's native-set times at the k-th size over its launches; None where not measured."""
        times = [x.rows[k][2][0].get(self.native).time_s for x in self.by_backend[b]]
        return None if None in times else SizeSpread(times)

    def _busbw(self, nbytes: int, time_s: float) -> float:
        return nbytes / time_s / 1e9 * self.coll.busbw_factor(self.world)

    def header_lines(self) -> list[str]:
        op, native = self.args.op, SETS[self.native]
        bws = self.copy_bws
        lines = self.report.header_lines()
        if bws:
            lines.append(
                f"Copy bandwidth (the memory floor's unit): the median of the {len(bws)} launches' "
                f"({min(bws) / 1e9:.2f}-{max(bws) / 1e9:.2f} GB/s)"
            )
        lines += [
            f"Spread, {native} ({op}'s own set): per size and backend, best, median and worst = the least, "
            f"the median (for an even N, the mean of the middle two) and the greatest of the {self.n} "
            "launches' times; busbw at the median; worst/best = the worst launch's time / the best's "
            "(1.00: no spread)",
            "The closing lines count the wrong elements of every launch and compare the medians",
        ]
        return lines

    def table_lines(self) -> list[str]:
        widths = [max(w, len(name)) for name, w in COLUMNS]
        widths[1] = max([widths[1]] + [len(x) for x in self.labels])

        def line(prefix: str, cells: list[str]) -> str:
            return prefix + " ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

        out = [line("# ", [name for name, _ in COLUMNS])]
        for k, (nbytes, _) in enumerate(self.sizes):
            for b, label in enumerate(self.labels):
                s = self.spread(b, k)
                if s is None:
                    cells = ["N/A"] * 5
                else:
                    cells = [f"{s.best * 1e6:.1f}", f"{s.median * 1e6:.1f}", f"{s.worst * 1e6:.1f}",
                             f"{self._busbw(nbytes, s.median):.2f}", f"{s.worst_over_best:.2f}"]
                out.append(line("  ", [str(nbytes), label, *cells]))
        return out

    def closing_lines(self) -> list[str]:
        """Per backend, worst/best at the smallest and the largest size."""
        ends = sorted({0, len(self.sizes) - 1})
        out = []
        for b, label in enumerate(self.labels):
            parts = []
            for k in ends:
                s = self.spread(b, k)
                if s is not None:
                    parts.append(f"{format_size(self.sizes[k][0])} worst/best = {s.worst_over_best:.2f}")
            if parts:
                out.append(f"# {label}: spread over {self.n} launches: {', '.join(parts)}")
        return out

    def records(self) -> list[dict]:
        """The table as JSON: one record per size and backend, in microseconds."""
        out = []
        for k, (nbytes, count) in enumerate(self.sizes):
            for b, name in enumerate(self.names):
                s = self.spread(b, k)
                out.append({
                    "backend": name, "bytes": nbytes, "count": count, "set": SETS[self.native],
                    "launches": self.n,
                    "best_us": None if s is None else s.best * 1e6,
                    "median_us": None if s is None else s.median * 1e6,
                    "worst_us": None if s is None else s.worst * 1e6,
                    "busbw_GBps": None if s is None else self._busbw(nbytes, s.median),
                    "worst_over_best": None if s is None else s.worst_over_best,
                })
        return out

    def launch_records(self) -> list[dict]:
        """Every launch's rows, in the order they ran, as one run's JSON has them."""
        launches = sorted((x for ls in self.by_backend for x in ls), key=lambda x: (x.number, x.backend))
        return [{"launch": x.number, "backend": self.names[x.backend],
                 "copy_bandwidth_GBps": None if x.copy_bw is None else x.copy_bw / 1e9,
                 "rows": self.report.records(x.rows, [self.names[x.backend]])} for x in launches]

    def print(self) -> None:
        for line in self.header_lines():
            print(comment(line, not self.report.full))
        print("#")
        print("\n".join(self.table_lines() + self.closing_lines()), flush=True)
        rows = self.median_rows()
        self.report.summary(rows)
        self.report.headline(rows)
        sys.stdout.flush()
        if self.args.json:
            self.report.write_json(rows, self.args.json, {
                "rows_over_launches": "median time of each figure; wrong summed over the launches",
                "spread": self.records(),
                "launches": self.launch_records(),
            })
        if self.args.plot:
            self.report.plot(rows, self.args.plot)

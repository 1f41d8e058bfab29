"""Reads the flight-recorder dumps of every rank and says which rank is missing which op.

    python -m ringreduce.flight [DIR_OR_FILE ...]     (default: $RINGREDUCE_FLIGHT_DIR, else
                                                       $TMPDIR/ringreduce-flight)

(The command is ``__main__.py`` beside this file: ``import ringreduce`` imports this module, so
running the module itself as ``__main__`` would load it twice, and runpy warns about that.)

Each rank of a group keeps its last ops (``RINGREDUCE_FLIGHT_RECORDER``, 1000 by default) and
writes them to ``ringreduce_flight_<group>_rank<r>.json`` when an op of the group first fails, or
when asked (:func:`dump`). For each group found, this prints:

- the ranks that left no dump (they never failed an op nor were asked to dump: often the one
  that holds the others up);
- per rank, the last op it issued and how far that got;
- the first op where the ranks' records differ: ops that some ranks issued and others did not
  (``rank 2 is missing op #12 allreduce [1048576] Float: the last op it issued is #11``), or the
  same sequence number given to different ops, shapes or dtypes (a desynchronised job).

It exits with 0 when the dumps agree, 1 when it found a rank missing an op or a mismatch, and 2
when there is nothing to read.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict

__all__ = ["dump", "default_dir", "load", "analyse", "main"]


def default_dir() -> str:
    """Where the ranks write their dumps unless told otherwise, as the extension defines it
    (``RINGREDUCE_FLIGHT_DIR``, else ``$TMPDIR/ringreduce-flight``)."""
    from ringreduce import load_extension
    return load_extension().default_flight_dir()


def dump(group=None, directory: str | None = None, reason: str = "requested") -> str:
    """Writes this rank's flight recorder of ``group`` (default: the world) and returns the path.

    ``directory`` defaults to ``RINGREDUCE_FLIGHT_DIR`` (else ``$TMPDIR/ringreduce-flight``).
    Every rank of the group should call it for the reader to see the whole group; it is local to
    this rank and sends nothing.
    """
    import torch
    import torch.distributed as dist

    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise RuntimeError("ringreduce.flight.dump: no default process group: call "
                           "torch.distributed.init_process_group first")
    if dist.get_backend(pg) != "ringreduce":
        raise ValueError(f"ringreduce.flight.dump: the group uses the {dist.get_backend(pg)!r} "
                         "backend; only ringreduce groups keep a flight recorder")
    backend = pg._get_backend(torch.device("cpu"))
    return backend.dump_flight_recorder(directory or "", reason)


def load(paths) -> dict[str, dict[int, dict]]:
    """Dumps found in ``paths`` (files or directories), by group id and rank. A file that is not
    a dump is reported on stderr and skipped."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "ringreduce_flight_*_rank*.json")))
        else:
            files.append(p)
    groups: dict[str, dict[int, dict]] = defaultdict(dict)
    for f in files:
        try:
            with open(f) as fh:
                d = json.load(fh)
            if d.get("format") != "ringreduce-flight-1":
                raise ValueError("not a ringreduce flight-recorder dump")
            d["_path"] = f
            groups[d["group"]][int(d["rank"])] = d
        except (OSError, ValueError, KeyError) as e:
            print(f"ringreduce.flight: skipped {f}: {e}", file=sys.stderr)
    return dict(groups)


def _describe(op: dict) -> str:
    dtype = f" {op['dtype']}" if op.get("dtype") else ""
    return f"#{op['seq']} {op['op']} {op['shapes']}{dtype}".rstrip()


def _state(op: dict) -> str:
    s = op["state"]
    if s in ("completed", "failed") and op.get("started_us"):
        s += f" after {(op['ended_us'] - op['started_us']) / 1e3:.0f} ms"
    if op.get("error"):
        s += f": {op['error']}"
    return s


def _ops(n: int) -> str:
    return f"{n} op" if n == 1 else f"{n} ops"


def _ranges(ranks) -> str:
    ranks = sorted(ranks)
    return ", ".join(str(r) for r in ranks)


def analyse(group: str, dumps: dict[int, dict]) -> tuple[list[str], bool]:
    """Lines of the report for one group, and whether something is wrong."""
    world = max(d["world_size"] for d in dumps.values())
    lines = [f"group {group}: world size {world}, dumps from ranks {_ranges(dumps)}"]
    problem = False
    missing_dumps = [r for r in range(world) if r not in dumps]
    if missing_dumps:
        lines.append(f"  no dump from rank{'s' if len(missing_dumps) > 1 else ''} "
                     f"{_ranges(missing_dumps)}: never failed an op nor was asked to dump "
                     "(if the others timed out, look at it first)")
        problem = True
    ops = {r: {op["seq"]: op for op in d["ops"]} for r, d in dumps.items()}
    issued = {r: d["ops_issued"] for r, d in dumps.items()}
    for r in sorted(dumps):
        d = dumps[r]
        if d["ops"]:
            last = d["ops"][-1]
            lines.append(f"  rank {r} ({d['host']}, pid {d['pid']}): issued {_ops(issued[r])}; last "
                         f"{_describe(last)}, {_state(last)}")
        else:
            lines.append(f"  rank {r} ({d['host']}, pid {d['pid']}): issued {_ops(issued[r])} "
                         "(none kept)")
    # Compare within the window every dump still holds.
    lo = max((min(o) if o else issued[r]) for r, o in ops.items())
    hi = max(issued.values())
    for seq in range(lo, hi):
        have = {r: o[seq] for r, o in ops.items() if seq in o}
        lacking = sorted(r for r in ops if seq not in ops[r])
        kinds = defaultdict(list)
        for r, op in have.items():
            kinds[(op["op"], op["shapes"], op.get("dtype", ""))].append(r)
        if len(kinds) > 1:
            problem = True
            lines.append(f"  op #{seq} differs between ranks (a desynchronised job):")
            for (name, shapes, dtype), rs in sorted(kinds.items(), key=lambda kv: min(kv[1])):
                lines.append(f"    ranks {_ranges(rs)}: {name} {shapes} {dtype}".rstrip())
        if lacking:
            problem = True
            example = have[min(have)]
            for r in lacking:
                lines.append(f"  rank {r} is missing op {_describe(example)}: the last op it "
                             f"issued is #{issued[r] - 1}" if issued[r] else
                             f"  rank {r} is missing op {_describe(example)}: it issued no op")
            states = defaultdict(list)
            for r, op in have.items():
                states[op["state"]].append(r)
            lines.append("    ranks that issued it: " + "; ".join(
                f"{_ranges(rs)} {st}" for st, rs in sorted(states.items())))
            break  # later ops follow from this one
        if len(kinds) > 1:
            break
    if not problem:
        lines.append(f"  the ranks agree on ops #{lo} to #{hi - 1}")
    return lines, problem


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ringreduce.flight",
                                 description="Reads ringreduce flight-recorder dumps and says which "
                                             "rank is missing which op.")
    ap.add_argument("paths", nargs="*",
                    help="dump files or directories (default: $RINGREDUCE_FLIGHT_DIR, else "
                         "$TMPDIR/ringreduce-flight, else /tmp/ringreduce-flight)")
    ap.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = ap.parse_args(argv)
    if not args.paths:  # asked of the extension only now, so that --help needs no build
        args.paths = [default_dir()]
    groups = load(args.paths)
    if not groups:
        print(f"ringreduce.flight: no dumps in {', '.join(args.paths)}", file=sys.stderr)
        return 2
    any_problem = False
    report = {}
    for g in sorted(groups):
        lines, problem = analyse(g, groups[g])
        any_problem |= problem
        report[g] = {"problem": problem, "lines": lines}
        if not args.json:
            print("\n".join(lines))
    if args.json:
        print(json.dumps(report, indent=2))
    return 1 if any_problem else 0

"""Message sizes as people write them and as the tables print them: the one parser and the one
formatter for this package (the benchmark, the cost model) and for the scripts in benchmarks/."""

from __future__ import annotations

import argparse
import re

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from '1024', '1K', '64M', '1G' (binary units, as in nccl-tests; 'KB'/'KiB' also read)."""
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(
            f"cannot parse size {text!r}: expected a whole number with an optional K, M or G suffix"
        )
    return int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]


def size_arg(text: str) -> int:
    """parse_size as an argparse type: argparse shows an ArgumentTypeError's own message, where for
    a ValueError it would say only "invalid value"."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def size_sweep(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return sizes


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"

"""How the extension was built: the small op's functions placed together (setup.py,
hot_path_link_args) and the list that names them (csrc/hot_path.txt, scripts/hot_path.py)."""

import os
import shutil
import subprocess

import pytest

import ringreduce
from ringreduce import _build_info

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOT_PATH = os.path.join(ROOT, "csrc", "hot_path.txt")
# The share of the list's names the build must still define: a few renamed functions leave the
# rest in place, a list most of whose names are gone is to be written again.
MIN_FOUND = 0.9

needs_binutils = pytest.mark.skipif(shutil.which("nm") is None or shutil.which("readelf") is None,
                                    reason="needs nm and readelf (binutils)")


def _module() -> str:
    return ringreduce.load_extension().__file__


def _listed() -> list[str]:
    with open(HOT_PATH) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def _symbols(module: str) -> dict[str, list[tuple[int, int]]]:
    """{name: [(address, size), ...]}: a local function (a compiler's clone, say) can have the
    same name in several objects."""
    text = subprocess.run(["nm", "--defined-only", "-S", module], capture_output=True, text=True, check=True).stdout
    out: dict[str, list[tuple[int, int]]] = {}
    for p in (line.split() for line in text.splitlines()):
        if len(p) == 4:
            out.setdefault(p[3], []).append((int(p[0], 16), int(p[1], 16)))
    return out


def _ours(name: str) -> bool:
    """A function of ringreduce's own source, by a name that stays while its code does: not
    torch's, pybind11's or the standard library's (which move with their versions), nor a clone
    the compiler named (.isra.0, .constprop.0, .avx2)."""
    return name.startswith("_ZN10ringreduce") and "." not in name


def _section(module: str, name: str) -> tuple[int, int] | None:
    text = subprocess.run(["readelf", "-SW", module], capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 5 and parts[1] == name:
            return int(parts[3], 16), int(parts[5], 16)
    return None


@needs_binutils
def test_the_hot_path_list_names_functions_the_build_has():
    names = [n for n in _listed() if _ours(n)]
    assert names, "csrc/hot_path.txt names none of ringreduce's own functions"
    defined = _symbols(_module())
    missing = [n for n in names if n not in defined]
    assert len(missing) <= (1 - MIN_FOUND) * len(names), (
        f"{len(missing)} of the {len(names)} ringreduce functions csrc/hot_path.txt names are not in "
        f"the build (first: {missing[:3]}): write it again with `python scripts/hot_path.py`")


@needs_binutils
def test_the_small_ops_functions_lie_together_where_the_linker_took_the_script():
    if not getattr(_build_info, "HOT_PATH_LINKED", False):
        pytest.skip(f"the build did not place them: {getattr(_build_info, 'HOT_PATH_NOTE', 'an older build')}")
    module = _module()
    section = _section(module, ".text.ringreduce_hot")
    assert section is not None, "the module has no .text.ringreduce_hot section"
    start, size = section
    inside = lambda addr: start <= addr < start + size  # noqa: E731
    defined = _symbols(module)
    listed = [n for n in _listed() if n in defined]
    # Every listed function of ringreduce's own is there (one copy of it, where there are several).
    outside = [n for n in listed if _ours(n) and not any(inside(a) for a, _ in defined[n])]
    assert not outside, f"{len(outside)} listed functions lie outside .text.ringreduce_hot: {outside[:3]}"
    # And nothing unlisted: the section is the listed functions that lie in it, by address (a
    # constructor's complete and base forms, say, are one function), and their alignment.
    placed = {a: z for n in listed for a, z in defined[n] if inside(a)}
    listed_bytes = sum(placed.values())
    assert listed_bytes <= size <= listed_bytes + 64 * len(placed) + 4096, (
        f".text.ringreduce_hot is {size} bytes for {listed_bytes} bytes of listed functions")

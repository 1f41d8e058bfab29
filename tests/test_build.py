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


def _symbols(module: str) -> dict[str, int]:
    text = subprocess.run(["nm", "--defined-only", module], capture_output=True, text=True, check=True).stdout
    return {p[2]: int(p[0], 16) for p in (line.split() for line in text.splitlines()) if len(p) == 3}


def _sizes(module: str) -> dict[str, int]:
    text = subprocess.run(["nm", "--defined-only", "-S", module], capture_output=True, text=True, check=True).stdout
    return {p[3]: int(p[1], 16) for p in (line.split() for line in text.splitlines()) if len(p) == 4}


def _section(module: str, name: str) -> tuple[int, int] | None:
    text = subprocess.run(["readelf", "-SW", module], capture_output=True, text=True, check=True).stdout
    for line in text.splitlines():
        parts = line.replace("[ ", "[").split()
        if len(parts) > 5 and parts[1] == name:
            return int(parts[3], 16), int(parts[5], 16)
    return None


@needs_binutils
def test_the_hot_path_list_names_functions_the_build_has():
    names = _listed()
    assert names, "csrc/hot_path.txt is empty"
    defined = _symbols(_module())
    missing = [n for n in names if n not in defined]
    assert len(missing) <= (1 - MIN_FOUND) * len(names), (
        f"{len(missing)} of the {len(names)} functions csrc/hot_path.txt names are not in the build "
        f"(first: {missing[:3]}): write it again with `python scripts/hot_path.py`")


@needs_binutils
def test_the_small_ops_functions_lie_together_where_the_linker_took_the_script():
    if not getattr(_build_info, "HOT_PATH_LINKED", False):
        pytest.skip(f"the build did not place them: {getattr(_build_info, 'HOT_PATH_NOTE', 'an older build')}")
    module = _module()
    section = _section(module, ".text.ringreduce_hot")
    assert section is not None, "the module has no .text.ringreduce_hot section"
    start, size = section
    defined = _symbols(module)
    found = [n for n in _listed() if n in defined]
    outside = [n for n in found if not start <= defined[n] < start + size]
    assert not outside, f"{len(outside)} listed functions lie outside .text.ringreduce_hot: {outside[:3]}"
    # And nothing else: the section holds the listed functions (and their alignment) alone.
    sizes = _sizes(module)
    # By address: a constructor's complete and base forms, say, can be one function.
    listed_bytes = sum(dict((defined[n], sizes.get(n, 0)) for n in found).values())
    assert listed_bytes <= size <= listed_bytes + 64 * len(found) + 4096, (
        f".text.ringreduce_hot is {size} bytes for {listed_bytes} bytes of listed functions")

"""Builds the extension ringreduce._C against the torch that is installed.

Build without isolation, so that pip uses this environment's torch and never downloads another:

    pip install --no-build-isolation --no-deps -e .
"""

import glob
import os
import shutil
import sys

from setuptools import find_packages, setup

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:  # pragma: no cover - the message is the point
    sys.exit(
        "ringreduce: building needs torch installed in this environment, and pip's build "
        "isolation turned off:\n    pip install --no-build-isolation --no-deps -e .\n"
        "(or run `make build`, which sets up .venv with torch first)"
    )

ROOT = os.path.dirname(os.path.abspath(__file__))


def project_version():
    """pyproject.toml's version: the one place it is written."""
    import re

    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
    return m.group(1) if m else "unknown"


VERSION = project_version()


def build_config():
    """build.cfg, which CMakeLists.txt reads too: {KEY: [words]}."""
    cfg = {}
    with open(os.path.join(ROOT, "build.cfg")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#"):
                key, _, value = line.partition("=")
                cfg[key.strip()] = value.split()
    return cfg


BUILD = build_config()


def sources(*patterns):
    found = []
    for pattern in patterns:
        found += glob.glob(os.path.join("csrc", pattern), recursive=True)
    return sorted(found)


# Sources that need the CUDA toolkit: the core's (build.cfg) and the torch layer's CUDA side.
# Built only when cuda_build_reason() says so.
CUDA_SOURCES = sources(*BUILD["CUDA_SOURCES"], "backend/cuda_*.cpp")

# The torch-free core (build.cfg; also built on its own by CMakeLists.txt) and the torch layer.
CPU_SOURCES = [s for s in sources(
    *(f"{d}/**/*.cpp" for d in BUILD["CORE_DIRS"]),
    "backend/*.cpp",
    "bucket/*.cpp",
    "bindings.cpp",
) if s not in CUDA_SOURCES]


def cuda_build_reason():
    """Whether the CUDA sources are built, and why (not)."""
    if os.environ.get("RINGREDUCE_NO_CUDA", "") not in ("", "0"):
        return False, "RINGREDUCE_NO_CUDA is set"
    if torch.version.cuda is None:
        return False, "the installed torch has no CUDA"
    if cpp_extension.CUDA_HOME is None or shutil.which("nvcc", path=os.path.join(cpp_extension.CUDA_HOME, "bin")) is None:
        if shutil.which("nvcc") is None:
            return False, "nvcc was not found (set CUDA_HOME)"
    return True, f"torch {torch.__version__} has CUDA {torch.version.cuda}"


with_cuda, reason = cuda_build_reason()
print(f"ringreduce: {'building' if with_cuda else 'not building'} the CUDA sources: {reason}")

cxx_flags = [
    "-O3",
    *BUILD["CXX_FLAGS"],  # the numerics every build shares (build.cfg says why)
    "-Wall",
    "-Wno-unused-parameter",
    # Only PyInit__C (and what torch's and pybind11's headers mark) leaves the module: calls
    # between our own functions are direct, not through the PLT, and our copies of inline and
    # template code cannot bind to, or be bound by, another extension's, as pybind11 advises for
    # every module.
    "-fvisibility=hidden",
    "-fvisibility-inlines-hidden",
    f'-DRINGREDUCE_TORCH_VERSION="{torch.__version__}"',
    f'-DRINGREDUCE_VERSION="{VERSION}"',
    # Numeric, for the few c10d hooks whose signature is newer than some torch we build against.
    "-DRINGREDUCE_TORCH_MINOR=%d" % (int(torch.__version__.split(".")[0]) * 100
                                     + int(torch.__version__.split(".")[1])),
]

HOT_PATH = os.path.join(ROOT, "csrc", "hot_path.txt")


def hot_path_link_args():
    """The link arguments that put the functions csrc/hot_path.txt names (scripts/hot_path.py
    writes it) together at the start of the module's code, and why not where they are empty.

    A small op from Python runs about a hundred functions of the module. Where the linker leaves
    them, among the module's other code, they lie on some 60 code pages, which torch's and the
    interpreter's code between two calls pushes out of the TLB and the caches (docs/design.md,
    "The path of an op"). A linker script with INSERT adds an output section before .text to the
    linker's own script: GNU ld and lld take it. A name the build no longer has matches nothing
    and its function stays where it was."""
    if not os.path.exists(HOT_PATH):
        return [], "no csrc/hot_path.txt"
    with open(HOT_PATH) as f:
        names = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    out_dir = os.path.join(ROOT, "build", "ext")
    os.makedirs(out_dir, exist_ok=True)
    script = os.path.join(out_dir, "hot_path.ld")
    text = ("/* Written by setup.py from csrc/hot_path.txt. */\nSECTIONS\n{\n  .text.ringreduce_hot :\n  {\n"
            + "".join(f"    *(.text.{n})\n" for n in names) + "  }\n}\nINSERT BEFORE .text;\n")
    old = open(script).read() if os.path.exists(script) else None
    if old != text:
        with open(script, "w") as f:
            f.write(text)
    args = ["-Xlinker", "-T", "-Xlinker", script]
    # A trial link: a linker that cannot take the script (gold, for one) builds the module as
    # before. The real link may still use another (LDFLAGS, sysconfig's LDSHARED): BuildExt links
    # again without the script where that one refuses it.
    import shlex
    import subprocess
    import tempfile

    cxx = shlex.split(os.environ.get("CXX", "c++")) + shlex.split(os.environ.get("LDFLAGS", ""))
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "t.cpp")
        with open(src, "w") as f:
            f.write("int ringreduce_hot_path_trial(int x) { return x + 1; }\n")
        try:
            r = subprocess.run(cxx + ["-shared", "-fPIC", "-ffunction-sections", src, "-o",
                                      os.path.join(tmp, "t.so"), *args], capture_output=True, text=True)
        except OSError as e:
            return [], f"no trial link ({e})"
    if r.returncode != 0:
        return [], f"the linker did not take the script ({(r.stderr.strip().splitlines() or ['?'])[-1]})"
    return args, f"the {len(names)} names of csrc/hot_path.txt placed first"


hot_link_args, hot_note = hot_path_link_args()
print(f"ringreduce: the small op's code: {hot_note}")
if hot_link_args:
    # Each function in a section of its own, which the script can name.
    cxx_flags.append("-ffunction-sections")


def write_build_info(hot_linked: bool, note: str) -> None:
    """The torch this build is for, whether it handles CUDA tensors, and where the small op's code
    lies, readable without loading the extension (see ringreduce/_registration.py)."""
    with open(os.path.join(ROOT, "ringreduce", "_build_info.py"), "w") as f:
        f.write(f'"""Written by setup.py."""\n\nTORCH_VERSION = {torch.__version__!r}\n'
                f'WITH_CUDA = {with_cuda!r}\nCUDA_NOTE = {reason!r}\n'
                f'HOT_PATH_LINKED = {hot_linked!r}\nHOT_PATH_NOTE = {note!r}\n')


write_build_info(bool(hot_link_args), hot_note)


class BuildExt(cpp_extension.BuildExtension.with_options(use_ninja=True)):
    def build_extension(self, ext):
        from setuptools.errors import LinkError

        try:
            super().build_extension(ext)
        except LinkError as e:
            args = list(ext.extra_link_args)
            at = next((i for i in range(len(args)) if args[i:i + len(hot_link_args)] == hot_link_args), None)
            if not hot_link_args or at is None:
                raise
            # Objects built with -ffunction-sections link as well without the script.
            note = "the module's link refused the script: built without it"
            print(f"ringreduce: the small op's code: {note} ({e})")
            ext.extra_link_args = args[:at] + args[at + len(hot_link_args):]
            write_build_info(False, note)
            super().build_extension(ext)

    def finalize_options(self):
        super().finalize_options()
        # pip's editable builds compile in a fresh temporary directory every time; a fixed one
        # lets ninja rebuild only the sources that changed.
        self.build_temp = os.path.join(ROOT, "build", "ext")


cuda_note = "built without CUDA: " + reason
if with_cuda:
    # The GPUs of build.cfg, unless the caller names others.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", ";".join(BUILD["CUDA_ARCHS"]))
    ext = cpp_extension.CUDAExtension(
        name="ringreduce._C",
        sources=CPU_SOURCES + CUDA_SOURCES,
        include_dirs=[os.path.join(ROOT, "csrc")],
        define_macros=[("RINGREDUCE_WITH_CUDA", "1")],
        extra_compile_args={
            "cxx": cxx_flags,
            "nvcc": BUILD["NVCC_FLAGS"] + ["-std=c++17"],
        },
        extra_link_args=hot_link_args,
        depends=[HOT_PATH] if os.path.exists(HOT_PATH) else [],
        libraries=["rt"],
    )
else:
    ext = cpp_extension.CppExtension(
        name="ringreduce._C",
        sources=CPU_SOURCES,
        include_dirs=[os.path.join(ROOT, "csrc")],
        extra_compile_args={"cxx": cxx_flags + [f'-DRINGREDUCE_CUDA_NOTE="{cuda_note}"']},
        extra_link_args=hot_link_args,
        depends=[HOT_PATH] if os.path.exists(HOT_PATH) else [],
        libraries=["rt"],
    )

setup(
    packages=find_packages(include=["ringreduce", "ringreduce.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
)

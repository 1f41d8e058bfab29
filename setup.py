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


def sources(*patterns):
    found = []
    for pattern in patterns:
        found += glob.glob(os.path.join("csrc", pattern), recursive=True)
    return sorted(found)


# The torch-free core (also built on its own by CMakeLists.txt) and the torch layer.
CPU_SOURCES = sources(
    "common/*.cpp",
    "reduce/*.cpp",
    "transport/**/*.cpp",
    "ring/*.cpp",
    "p2p/*.cpp",
    "backend/*.cpp",
    "bucket/*.cpp",
    "bindings.cpp",
)


def cuda_build_reason():
    """Why the CUDA sources are (not) built: the seam the CUDA issue fills in."""
    if torch.version.cuda is None:
        return False, "the installed torch has no CUDA"
    if shutil.which("nvcc") is None and cpp_extension.CUDA_HOME is None:
        return False, "nvcc was not found"
    cu = sources("reduce/*.cu", "transport/**/*.cu")
    if not cu:
        return False, "this version of ringreduce has no CUDA sources yet"
    return True, f"torch {torch.__version__} has CUDA {torch.version.cuda}"


# The torch this build is for, readable without loading the extension (see load_extension()).
with open(os.path.join(ROOT, "ringreduce", "_build_info.py"), "w") as f:
    f.write(f'"""Written by setup.py."""\n\nTORCH_VERSION = {torch.__version__!r}\n')

with_cuda, reason = cuda_build_reason()
print(f"ringreduce: {'building' if with_cuda else 'not building'} the CUDA sources: {reason}")

cxx_flags = [
    "-O3",
    "-fno-math-errno",
    # No a*b+c fused into an FMA: whether it happens would depend on which ISA clone of a kernel
    # runs, and every rank must compute the same bits.
    "-ffp-contract=off",
    "-Wall",
    "-Wno-unused-parameter",
    f'-DRINGREDUCE_TORCH_VERSION="{torch.__version__}"',
    # Numeric, for the few c10d hooks whose signature is newer than some torch we build against.
    "-DRINGREDUCE_TORCH_MINOR=%d" % (int(torch.__version__.split(".")[0]) * 100
                                     + int(torch.__version__.split(".")[1])),
]

class BuildExt(cpp_extension.BuildExtension.with_options(use_ninja=True)):
    def finalize_options(self):
        super().finalize_options()
        # pip's editable builds compile in a fresh temporary directory every time; a fixed one
        # lets ninja rebuild only the sources that changed.
        self.build_temp = os.path.join(ROOT, "build", "ext")


ext = cpp_extension.CppExtension(
    name="ringreduce._C",
    sources=CPU_SOURCES,
    include_dirs=[os.path.join(ROOT, "csrc")],
    extra_compile_args={"cxx": cxx_flags},
    libraries=["rt"],
)

setup(
    packages=find_packages(include=["ringreduce", "ringreduce.*"]),
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt},
)

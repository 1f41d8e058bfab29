# ringreduce: set-up, build, tests and the benchmark, each from a fresh checkout.
#
#   make bench    set up .venv, build, print the all-reduce bandwidth table (ringreduce beside gloo)
#   make test     set up .venv, build, run the C++ core tests (plain, ASan/UBSan, TSan) and pytest
#                 (then the collective suites again over the TCP transport)
#   make bench-peers  set up .venv-peers (OpenMPI's mpi4py, DeepSpeed) and .venv-intel (Intel MPI,
#                 oneCCL), then time all-reduce for ringreduce (dist.all_reduce and its direct op),
#                 gloo, OpenMPI, Intel MPI, oneCCL and DeepSpeed's shared-memory all-reduce in one run
#   make test-torch-suite  torch's own DistributedTest suite on ringreduce and on gloo, compared
#                 (about an hour on 2 cores; `make test` runs a part of it)
#
# A second run reuses .venv and rebuilds only what changed. Variables:
#   TORCH_VERSION=2.13.0   the torch installed into .venv (the development machines have a CPU
#                          build of 2.13.0 on disk, which pip takes; elsewhere pip takes PyPI's)
#   PYTHON=python3         the interpreter that creates .venv
#   MAX_JOBS=2             parallel compile jobs
#   BENCH_ARGS=...         extra arguments for `python -m ringreduce.bench`
#   PEERS_ARGS=...         extra arguments for `benchmarks/peers.py` (e.g. -g 2 -b 1K -e 1M)

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
MAX_JOBS ?= 2
BENCH_ARGS ?=
PEERS_ARGS ?=
PYTEST_ARGS ?=
TORCH_SUITE_ARGS ?=

PY := $(VENV)/bin/python
DEPS_REV := 4# bump when the list of packages below changes, so existing .venvs get them
DEPS_STAMP := $(VENV)/.deps-torch-$(TORCH_VERSION)-$(DEPS_REV)
BUILD_STAMP := $(VENV)/.built
SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name 'hot_path.txt') setup.py pyproject.toml build.cfg

.PHONY: setup build test test-cpp test-py test-torch-suite bench bench-peers clean

setup: $(DEPS_STAMP)

# torch is pinned and installed first, on its own: every later install then finds it satisfied,
# so pip never fetches another torch (and the build runs without isolation against this one).
$(DEPS_STAMP):
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PY) -m pip install --quiet pybind11 ninja pytest hypothesis numpy scikit-learn setuptools wheel \
		expecttest
	rm -f $(VENV)/.deps-torch-* $(BUILD_STAMP)
	touch $@

build: $(BUILD_STAMP)

$(BUILD_STAMP): $(DEPS_STAMP) $(SOURCES)
	MAX_JOBS=$(MAX_JOBS) $(PY) -m pip install --quiet --no-build-isolation --no-deps -e .
	touch $@

test: test-cpp test-py

# The torch-free core on its own, then again under AddressSanitizer + UndefinedBehaviorSanitizer
# (a Debug build: CMakeLists.txt picks it for sanitizers). ninja comes from .venv. ctest runs the
# executables MAX_JOBS at a time: each is a process of its own, the kernel tests the longest.
test-cpp: $(DEPS_STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" cmake -S . -B build/core -G Ninja -DCMAKE_BUILD_TYPE=Release
	PATH="$(abspath $(VENV))/bin:$$PATH" cmake --build build/core -j $(MAX_JOBS)
	ctest --test-dir build/core --output-on-failure -j $(MAX_JOBS)
	# The sanitizer builds leave the CUDA sources out: the plain build above compiles every .cu file
	# (CI has no GPU to run them on), and nvcc's passes were a few minutes of each build.
	PATH="$(abspath $(VENV))/bin:$$PATH" cmake -S . -B build/asan -G Ninja -DRINGREDUCE_SANITIZE=address,undefined -DRINGREDUCE_CUDA=OFF
	PATH="$(abspath $(VENV))/bin:$$PATH" cmake --build build/asan -j $(MAX_JOBS)
	ctest --test-dir build/asan --output-on-failure -j $(MAX_JOBS)
	# The reduction kernels' tests (test_reduce*) start no threads, so TSan has nothing to find in
	# them: the TSan build leaves them out (their build and run were its longest minutes), the
	# plain and ASan/UBSan builds run them.
	PATH="$(abspath $(VENV))/bin:$$PATH" cmake -S . -B build/tsan -G Ninja -DRINGREDUCE_SANITIZE=thread -DRINGREDUCE_CUDA=OFF \
		-DRINGREDUCE_KERNEL_TESTS=OFF
	PATH="$(abspath $(VENV))/bin:$$PATH" cmake --build build/tsan -j $(MAX_JOBS)
	ctest --test-dir build/tsan --output-on-failure -j $(MAX_JOBS)

# Then the collective, point-to-point and soak suites again over TCP alone (loopback): the ring
# code is the same, the transport under it is not. The soak issues 500 ops there, not 1000.
test-py: $(BUILD_STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS) tests
	RINGREDUCE_TRANSPORT=tcp RINGREDUCE_SOAK_OPS=500 $(PY) -m pytest -q $(PYTEST_ARGS) tests/test_collectives.py \
		tests/test_p2p.py tests/test_soak.py

# torch's suite needs expecttest (torch's own test dependency). In `make test`, tests/test_torch_suite.py
# runs the part that covers what ringreduce had to change for it.
test-torch-suite: $(BUILD_STAMP)
	$(PY) scripts/torch_suite.py $(TORCH_SUITE_ARGS)

bench: $(BUILD_STAMP)
	$(PY) -m ringreduce.bench -g 2 $(BENCH_ARGS)
	$(PY) -m ringreduce.bench -g 4 $(BENCH_ARGS)

# The peers live in a venv of their own, so .venv gets nothing new: DeepSpeed pins and pulls in
# packages of its own. torch goes in first, the same version as .venv's, and DeepSpeed builds
# without isolation against it, so pip never fetches another torch (nor CUDA wheels). mpi4py is
# compiled against the system's OpenMPI (apt-get install openmpi-bin libopenmpi-dev): a prebuilt
# wheel would look for an MPI library of its own choosing at run time.
PEERS_VENV := .venv-peers
PEERS_PY := $(PEERS_VENV)/bin/python
PEERS_STAMP := $(PEERS_VENV)/.deps-torch-$(TORCH_VERSION)-1

$(PEERS_STAMP):
	test -x $(PEERS_PY) || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_PY) -m pip install --quiet "torch==$(TORCH_VERSION)"
	$(PEERS_PY) -m pip install --quiet setuptools wheel numpy ninja
	$(PEERS_PY) -m pip install --quiet --no-binary mpi4py mpi4py
	DS_ACCELERATOR=cpu $(PEERS_PY) -m pip install --quiet --no-build-isolation deepspeed
	rm -f $(PEERS_VENV)/.deps-torch-*
	touch $@

# Intel MPI and oneCCL get a venv of their own, .venv-intel, not .venv-peers: impi-rt puts its own
# mpirun, mpiexec, mpicc and libmpi.so.12 into the venv's bin/ and lib/, where they would shadow
# Open MPI's for whoever activates .venv-peers (whose mpi4py is built against Open MPI). Neither
# needs torch: benchmarks/peers.py compiles their drivers (benchmarks/peers/*.c, *.cpp) with this
# venv's mpicc and mpicxx into build/peers on first use. The versions are pinned because the next
# ones (impi-rt 2021.19, oneccl-cpu 2022.2) need a `libfabric` package that the index lacks.
# oneccl-cpu's libccl.so.1 needs libccl.so.2 (the same release's plugin loader, which also carries
# the Intel runtime's memcpy), and its wheel leaves that file out: it is taken from the full oneccl
# wheel of the same release, downloaded (not installed: that one pulls in the SYCL runtime).
INTEL_VENV := .venv-intel
INTEL_PY := $(INTEL_VENV)/bin/python
IMPI_VERSION := 2021.18.1
ONECCL_VERSION := 2022.1.2
INTEL_STAMP := $(INTEL_VENV)/.deps-impi-$(IMPI_VERSION)-oneccl-$(ONECCL_VERSION)

$(INTEL_STAMP):
	test -x $(INTEL_PY) || $(PYTHON) -m venv $(INTEL_VENV)
	$(INTEL_PY) -m pip install --quiet "impi-rt==$(IMPI_VERSION)" "impi-devel==$(IMPI_VERSION)" \
		"oneccl-cpu==$(ONECCL_VERSION)" "oneccl-cpu-devel==$(ONECCL_VERSION)"
	rm -rf $(INTEL_VENV)/.oneccl-wheel
	$(INTEL_PY) -m pip download --quiet --no-deps -d $(INTEL_VENV)/.oneccl-wheel "oneccl==$(ONECCL_VERSION)"
	$(INTEL_PY) -c 'import glob, shutil, sys, zipfile; \
		z = zipfile.ZipFile(glob.glob(sys.argv[1] + "/oneccl-*.whl")[0]); \
		src = z.open(next(n for n in z.namelist() if n.endswith("/lib/libccl.so.2"))); \
		shutil.copyfileobj(src, open(sys.argv[2], "wb")); \
		print("copied libccl.so.2 from", z.filename)' $(INTEL_VENV)/.oneccl-wheel $(INTEL_VENV)/lib/libccl.so.2
	rm -rf $(INTEL_VENV)/.oneccl-wheel
	rm -f $(INTEL_VENV)/.deps-impi-*
	touch $@

# ringreduce and gloo run under .venv's python; the script launches the peers with .venv-peers'
# python, and Intel MPI's and oneCCL's drivers under .venv-intel's mpiexec.
bench-peers: $(BUILD_STAMP) $(PEERS_STAMP) $(INTEL_STAMP)
	$(PY) benchmarks/peers.py --peers-python $(PEERS_PY) --intel-root $(INTEL_VENV) $(PEERS_ARGS)

clean:
	rm -rf build ringreduce/_C*.so *.egg-info $(BUILD_STAMP)

#!/usr/bin/env bash
# The GPU check, in one call on a GPU host whose python3 has torch (with CUDA), pybind11 and
# ninja, and no network: builds ringreduce against that torch, runs the GPU probe
# (scripts/gpu_probe: how ranks on one GPU can order their work), the C++ CUDA kernel test, the
# GPU tests and the GPU benchmark, and writes logs and result tables to the folder named by its
# argument (created if missing): at most 8 files (build.log with the host's versions first,
# probe.txt, tests.log with the C++ test's output first, the benchmark's tables and JSON, mps.txt).
#
#   scripts/gpu_check.sh OUT_DIR [quick]
#
# "quick" skips the benchmark. Environment: TESTS (pytest arguments; default the two GPU test
# files), BENCH_RANKS (default "2 4"), BENCH_SIZES (-b/-e/-f of the benchmark, default
# "-b 8K -e 256M -f 32"), SKIP_PROBE, SKIP_CPP, MPS=1 (afterwards, the probe and the 2-rank
# benchmark again under an MPS daemon that the script starts and stops). Exit status: non-zero
# if the build or any test failed.
set -uo pipefail
out="${1:?usage: scripts/gpu_check.sh OUT_DIR [quick]}"
mode="${2:-full}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
status=0

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -1
} > "$out/build.log" 2>&1

# The image's default compiler may link libstdc++ statically (one such image sets CXX to an
# /opt/gcc build that does); an extension with its own copy of libstdc++ beside torch's shared
# one crashes in its first iostream call. The system compiler links the shared one, as torch
# does. RINGREDUCE_KEEP_CXX=1 keeps the environment's compiler.
if [ -z "${RINGREDUCE_KEEP_CXX:-}" ] && [ -x /usr/bin/g++ ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ LDSHARED="/usr/bin/g++ -shared"
fi

echo "== build" | tee -a "$out/build.log"
if ! MAX_JOBS="${MAX_JOBS:-16}" "$py" -m pip install --no-build-isolation --no-deps -e . >> "$out/build.log" 2>&1; then
  tail -40 "$out/build.log"
  echo "gpu_check: the build failed (log: $out/build.log)"
  exit 1
fi
grep "ringreduce:" "$out/build.log" | head -3
if ldd ringreduce/_C*.so | grep -q libstdc++; then :; else
  echo "gpu_check: ringreduce/_C links no shared libstdc++ (a static copy crashes beside torch's)"
  exit 1
fi

echo "== GPU probe"
if [ -z "${SKIP_PROBE:-}" ]; then
  mkdir -p build
  if nvcc -O3 -std=c++17 -arch=sm_90 -o build/gpu_probe scripts/gpu_probe/probe.cu > "$out/probe.txt" 2>&1; then
    timeout "${PROBE_TIMEOUT:-240}" build/gpu_probe ${PROBE_ARGS:-} 2>&1 | tee "$out/probe.txt"
    timeout 120 "$py" scripts/gpu_probe/nccl_multi_rank.py 2>&1 | tee -a "$out/probe.txt"
  else
    cat "$out/probe.txt"
    status=1
  fi
fi

echo "== C++ CUDA kernel test"
if [ -z "${SKIP_CPP:-}" ] && command -v cmake > /dev/null; then
  if cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DRINGREDUCE_CUDA=ON \
       -DCMAKE_CUDA_ARCHITECTURES=90 > "$out/tests.log" 2>&1 &&
     cmake --build build/gpu -j 16 --target test_reduce_cuda >> "$out/tests.log" 2>&1; then
    build/gpu/test_reduce_cuda >> "$out/tests.log" 2>&1 || status=1
  else
    status=1
  fi
  tail -5 "$out/tests.log"
else
  echo "skipped (SKIP_CPP set, or no cmake)" | tee "$out/tests.log"
fi

echo "== GPU tests"
# shellcheck disable=SC2086
timeout "${TEST_TIMEOUT:-420}" "$py" -m pytest -q -rs ${TESTS:-tests/test_cuda.py tests/test_cuda_ordered.py} 2>&1 | tee -a "$out/tests.log" | tail -30
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

if [ "$mode" != quick ]; then
  echo "== benchmark"
  # 8K, 256K, 8M and 256M: the headline sizes (a small op's latency, a large one against the
  # memory floor and gloo), and two between. Its text is filed as a record (benchmarks/results/):
  # nccl-tests' full column sets, every set's time, algbw, busbw and #wrong, not the 120-column table.
  for n in ${BENCH_RANKS:-2 4}; do
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-300}" "$py" -m ringreduce.bench --device cuda --nproc "$n" ${BENCH_SIZES:--b 8K -e 256M -f 32} \
      --nccl-tests-columns --json "$out/bench_cuda_${n}ranks.json" 2>&1 | tee "$out/bench_cuda_${n}ranks.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  done
fi
if [ -n "${MPS:-}" ] && command -v nvidia-cuda-mps-control > /dev/null; then
  # With MPS the ranks' processes share one GPU context: no switch between contexts per ordering
  # point. Started and stopped here (it changes how every process on the GPU runs).
  echo "== under MPS" | tee "$out/mps.txt"
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/rr-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rr-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d >> "$out/mps.txt" 2>&1; then
    [ -x build/gpu_probe ] && timeout 120 build/gpu_probe --only mem-dev,host --sizes 8K,256K,8M,256M 2>&1 | tee -a "$out/mps.txt"
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-300}" "$py" -m ringreduce.bench --device cuda --nproc 2 ${BENCH_SIZES:--b 8K -e 256M -f 32} \
      --nccl-tests-columns 2>&1 | tee -a "$out/mps.txt"
    echo quit | nvidia-cuda-mps-control
  else
    echo "gpu_check: the MPS daemon did not start" | tee -a "$out/mps.txt"
  fi
fi
echo "gpu_check: exit $status"
exit $status

#!/bin/sh
# Fails unless the fp32 sum kernel in csrc/reduce/reduce_cpu.cpp compiles to packed SIMD adds.
#
# A vectorised loop is easy to lose without any test noticing (a cast, a new branch, a flag), and
# it is most of the speed of the CPU path, so we look at the machine code.
#
# usage: check_simd.sh CXX SOURCE_DIR WORK_DIR [expect-avx2]
#   expect-avx2: also require 256-bit vaddps in the AVX2 clone (GCC builds use target_clones).
# Exit 77 (ctest: skipped) where the check does not apply: not x86-64, or no objdump.
set -eu

cxx=$1
src=$2
work=$3
expect_avx2=${4:-}

case "$(uname -m)" in
  x86_64 | amd64) ;;
  *) echo "check_simd: not x86-64, skipped"; exit 77 ;;
esac
command -v objdump >/dev/null 2>&1 || { echo "check_simd: no objdump, skipped"; exit 77; }

mkdir -p "$work"
obj=$work/reduce_cpu_simd.o
dis=$work/reduce_cpu_simd.dis
"$cxx" -std=c++17 -O3 -ffp-contract=off -I"$src/csrc" -c "$src/csrc/reduce/reduce_cpu.cpp" -o "$obj"
objdump -d --no-show-raw-insn -C "$obj" >"$dis"

# The instructions of every function whose demangled name is an fp32 sum loop
# (reduce_distinct / reduce_into over Native<float> with ops::Sum), each line prefixed by that name.
body=$(awk '
  /^[0-9a-f]+ <.*>:$/ {
    keep = ($0 ~ /reduce_(distinct|into)</ && $0 ~ /Native<float>, [^>]*ops::Sum</)
    name = $0
    gsub(/ringreduce::\(anonymous namespace\)::/, "", name)
    sub(/^[0-9a-f]+ <void /, "", name)
    sub(/\(.*\) \[clone/, " [clone", name)
    sub(/>:$/, "", name)
    next
  }
  keep && NF { print name " :: " $0 }
' "$dis")

if [ -z "$body" ]; then
  echo "check_simd: FAIL: no fp32 sum kernel found in $obj (were the loops renamed?)"
  exit 1
fi
packed=$(printf '%s\n' "$body" | grep -cE '[[:space:]]v?addps[[:space:]]' || true)
if [ "$packed" -eq 0 ]; then
  echo "check_simd: FAIL: the fp32 sum kernels contain no packed add (addps/vaddps): not vectorised"
  exit 1
fi
echo "check_simd: $packed packed fp32 adds in the fp32 sum kernels"
printf '%s\n' "$body" | grep -E '[[:space:]]v?addps[[:space:]]' | head -n 8

if [ "$expect_avx2" = "expect-avx2" ]; then
  ymm=$(printf '%s\n' "$body" | grep -E '\[clone \.avx2\]' | grep -cE 'vaddps[[:space:]].*%ymm' || true)
  if [ "$ymm" -eq 0 ]; then
    echo "check_simd: FAIL: no 256-bit vaddps in the AVX2 clone of the fp32 sum kernels"
    exit 1
  fi
  echo "check_simd: $ymm 256-bit vaddps (ymm) in the AVX2 clones"
fi
# The same for the all-reduce's last reduce-scatter step (reduce_map_twice[_into], fp32 sum, with
# and without AVG's division): it runs on half of every all-reduced byte.
fused=$(awk '
  /^[0-9a-f]+ <.*>:$/ { keep = ($0 ~ /reduce_map_twice/ && $0 ~ /Native<float>, [^>]*ops::Sum</); next }
  keep && NF { print }
' "$dis")
fused_packed=$(printf '%s\n' "$fused" | grep -cE '[[:space:]]v?addps[[:space:]]' || true)
if [ "$fused_packed" -eq 0 ]; then
  echo "check_simd: FAIL: the fused fp32 sum kernels (reduce_map_twice) contain no packed add"
  exit 1
fi
echo "check_simd: $fused_packed packed fp32 adds in the fused fp32 sum kernels"
echo "check_simd: OK"

#!/usr/bin/env bash
# Reproduces the knob table of docs/knobs.md: all-reduce busbw (and 1 KiB latency) for each slice size and
# spin time, at 2 and 4 ranks, ringreduce alone. Run from the repository root after `make build`.
#   benchmarks/knob_sweep.sh [python]
set -euo pipefail
PY=${1:-.venv/bin/python}
row() {  # label, then env assignments for the ranks
  local label=$1; shift
  local out
  # The in-place columns (9: time, 11: busbw), every op waited on (-z 1), as the table was measured.
  out=$(env "$@" "$PY" -m ringreduce.bench -g "$G" -b 1K -e 32M -f 32768 --backends ringreduce --min-time 0.3 -z 1 \
    --nccl-tests-columns |
        awk '/^ +[0-9]+ / {printf "  %s B: %s us, %s GB/s busbw;", $1, $9, $11}')
  echo "ranks=$G $label:$out"
}
for G in 2 4; do
  for spin in 50 2; do row "spin=${spin}us" RINGREDUCE_SPIN_US=$spin; done
  for slice in 128K 256K 512K 1M; do row "slice=$slice" RINGREDUCE_SLICE_BYTES=$slice; done
done

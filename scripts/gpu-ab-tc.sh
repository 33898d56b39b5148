#!/usr/bin/env bash
# A/B of the tensor-core path's expert kernels on a CUDA machine after
# `bash scripts/gpu-bundle.sh`: the staged kernel (MOEKIT_TC_RA=0) and the
# register-operand kernel (tc_ra, the default on sm_90a), alternating in one
# call, same binary. Usage: scripts/gpu-ab-tc.sh OUT PRESET FORMATS TOKENS [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
out=$1 preset=$2 formats=$3 tokens=$4 rounds=${5:-2}
mkdir -p "$out"
export MOEKIT_CACHE_DIR=${MOEKIT_CACHE_DIR:-/tmp/moekit-kernels}
for r in $(seq 1 "$rounds"); do
  for ra in 0 1; do
    MOEKIT_TC_RA=$ra gpu-bundle/moekit bench --device cuda --dtype bf16 --preset "$preset" --format "$formats" \
      --tokens "$tokens" --path tc --min-time 0.1 --json "$out/${preset}_ra${ra}_r$r.json" > "$out/${preset}_ra${ra}_r$r.txt" 2>&1
  done
done

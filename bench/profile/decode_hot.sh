#!/usr/bin/env bash
# Where the decode path's kernels stall: ncu's SASS-level stall samples.
# Usage: bash bench/profile/decode_hot.sh preset format T kernel-regex
set -uo pipefail
M=${M:-./gpu-bundle/moekit}
export MOEKIT_CACHE_DIR=${MOEKIT_CACHE_DIR:-/tmp/moekit-kernels}
preset=${1:-qwen3-30b-a3b} fmt=${2:-affine4} t=${3:-1} k=${4:-decode_route}
$M bench --preset "$preset" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 --min-time 0 --path decode >/dev/null 2>&1
ncu --section WarpStateStats --section SourceCounters --kernel-name regex:"$k" --launch-skip 2 --launch-count 1 \
  --page source --print-source sass --csv \
  $M bench --preset "$preset" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 --min-time 0 --path decode 2>/dev/null |
  python3 bench/profile/ncu_hot.py

#!/usr/bin/env bash
# A/B of the decode path's kernel-boundary work (issue 10) on a GPU machine,
# from the gpu bundle (scripts/gpu-bundle.sh): CUDA-graph medians with
# programmatic dependent launch and L2 prefetch on (default), and with each
# turned off (MOEKIT_PDL=0, MOEKIT_DECODE_PREFETCH=0), same process order.
# Usage: bash bench/profile/decode_ab.sh   (PRESETS, FORMATS, TOKENS env)
set -uo pipefail
M=${M:-./gpu-bundle/moekit}
export MOEKIT_CACHE_DIR=${MOEKIT_CACHE_DIR:-/tmp/moekit-kernels}
if [ -f gpu-bundle/kcache.tar.xz ] && [ ! -d "$MOEKIT_CACHE_DIR" ]; then
  mkdir -p "$MOEKIT_CACHE_DIR" && tar xJf gpu-bundle/kcache.tar.xz -C "$MOEKIT_CACHE_DIR"
fi
PRESETS=${PRESETS:-qwen3-30b-a3b}
FORMATS=${FORMATS:-affine4,q4_k}
TOKENS=${TOKENS:-1,8}
for preset in $PRESETS; do
  for v in "1 1" "0 1" "1 0" "0 0"; do
    read -r pdl pf <<<"$v"
    echo "== $preset PDL=$pdl PREFETCH=$pf"
    MOEKIT_PDL=$pdl MOEKIT_DECODE_PREFETCH=$pf $M bench --preset "$preset" --format "$FORMATS" --tokens "$TOKENS" \
      --device cuda --dtype bf16 --min-time 0.3 --path decode 2>&1 |
      awk '/read bandwidth/ {print "  " $0} $NF ~ /Decode|TensorCore|General/ {printf "  %-14s T=%-3s graph %s ms  x floor %s\n", $1, $2, $10, $13}'
  done
done

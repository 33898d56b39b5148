#!/usr/bin/env bash
# Per-kernel profile of the CUDA decode path (issue 10) on a GPU machine,
# from the gpu bundle (scripts/gpu-bundle.sh): for each case, ncu's duration,
# issued instructions, DRAM bytes and grid of every kernel of one MoE call.
# Usage: bash bench/profile/decode_ncu.sh [out.csv]   (cases below)
set -uo pipefail
M=${M:-./gpu-bundle/moekit}
export MOEKIT_CACHE_DIR=${MOEKIT_CACHE_DIR:-/tmp/moekit-kernels}
if [ -f gpu-bundle/kcache.tar.xz ] && [ ! -d "$MOEKIT_CACHE_DIR" ]; then
  mkdir -p "$MOEKIT_CACHE_DIR" && tar xJf gpu-bundle/kcache.tar.xz -C "$MOEKIT_CACHE_DIR"
fi
CASES=${CASES:-"qwen3-30b-a3b:affine4:1 qwen3-30b-a3b:q4_k:1 qwen3-30b-a3b:bf16:1 qwen3-30b-a3b:q8_0:1 mixtral-8x7b:affine4:1 qwen3-30b-a3b:affine4:8"}
MET=gpu__time_duration.sum,smsp__inst_executed.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
for c in $CASES; do
  IFS=: read -r preset fmt t <<<"$c"
  echo "== $preset $fmt T=$t"
  # warm the JIT cache first so ncu sees only the MoE call's kernels
  $M bench --preset "$preset" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 --min-time 0 --path decode >/dev/null 2>&1
  ncu --metrics "$MET" --kernel-name regex:'decode_|route|sort|gather|tc_|permute|act_|norm' --launch-skip 6 --launch-count 6 --csv --print-units base \
    $M bench --preset "$preset" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 --min-time 0 --path decode 2>/dev/null |
    python3 bench/profile/ncu_table.py
done

# The same call as a graph replay, with gaps, where nsys is installed.
if command -v nsys >/dev/null; then
  for c in qwen3-30b-a3b:affine4:1 mixtral-8x7b:affine4:1; do
    IFS=: read -r preset fmt t <<<"$c"
    echo "== nsys graph trace $preset $fmt T=$t"
    rm -f /tmp/nsys_dec.*
    nsys profile -q --cuda-graph-trace=node -o /tmp/nsys_dec $M bench --preset "$preset" --format "$fmt" --tokens "$t" \
      --device cuda --dtype bf16 --min-time 0.2 --path decode >/dev/null 2>&1
    nsys stats -q --report cuda_gpu_trace --format csv /tmp/nsys_dec.nsys-rep 2>/dev/null | grep -E 'decode_|route' | tail -n 9 |
      awk -F, '{printf "start=%s dur=%s %s\n", $1, $2, substr($NF,1,60)}'
  done
else
  echo "no nsys"
fi

#!/usr/bin/env bash
# The measurements of 2026-11-28_prefetch/: ROUNDS rounds, each
# (1) bench/peers/ggml_cpu/compare.sh (q4_0, q4_k, q8_0; T = 1, 8; 1 and 2
# threads; ggml's router mode, its plain weights), then (2) moekit with the
# software prefetch off (MOEKIT_CPU_PREFETCH=0) and on (default), every
# format but the grid/ternary ones at T = 1, 2 threads.
#
#   bench/results/cpu_2core/qdot/run_prefetch.sh OUT_DIR [ROUNDS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
OUT="$(realpath -m "$1")"
ROUNDS="${2:-3}"
MOEKIT="$ROOT/target/release/moekit"
FORMATS=q4_0,q4_1,q5_0,q5_1,q8_0,q2_k,q3_k,q4_k,q5_k,q6_k,iq4_nl,iq4_xs,mxfp4,mlx-mxfp4,mlx-nvfp4,mlx-mxfp8,fp8-b128,affine2-g64,affine3-g64,affine4-g64,affine5-g64,affine6-g64,affine8-g64
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
    d="$OUT/round$r"
    mkdir -p "$d"
    echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"
    OUT="$d/compare" TYPES=q4_0,q4_k,q8_0 TOKENS=1,8 THREADS="1 2" MIN_TIME=0.5 GGML_MODES=router \
        REPACK=off BUSY_PCT=15 RETRIES=2 "$ROOT/bench/peers/ggml_cpu/compare.sh" >"$d/compare.log" 2>&1
    for pf in 0 4096; do
        MOEKIT_CPU_PREFETCH=$pf RAYON_NUM_THREADS=2 "$MOEKIT" bench --device cpu --preset qwen3-30b-a3b \
            --format $FORMATS --tokens 1 --min-time 0.4 --json "$d/pf${pf}_t2.json" >"$d/pf${pf}_t2.txt" 2>&1
    done
done
echo "== done $(date -u +%H:%M:%S)" | tee -a "$OUT/log.txt"

#!/usr/bin/env bash
# The measurements of bench/results/cpu_2core/qdot/2026-11-24b.md: ROUNDS
# alternating rounds, each (1) bench/peers/ggml_cpu/compare.sh for the GGUF
# types (ggml's router mode, then moekit with its default activations,
# threads 1 and 2), (2) moekit with f32 activations, (3) moekit with the
# integer kernels forced (MOEKIT_CPU_ACT=q8), every format, threads 1 and 2.
#
#   bench/results/cpu_2core/qdot/run_rounds.sh OUT_DIR [ROUNDS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../../.." && pwd)"
OUT="$(realpath -m "$1")"
ROUNDS="${2:-3}"
GGUF=q4_0,q4_k,q8_0,q4_1,q5_0,q5_1,q2_k,q3_k,q5_k,q6_k
ALL=$GGUF,affine4,affine8,affine2,affine3,affine5,affine6
MOEKIT="$ROOT/target/release/moekit"
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
    d="$OUT/round$r"
    mkdir -p "$d"
    echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"
    OUT="$d/compare" TYPES=$GGUF TOKENS=1,8 THREADS="1 2" MIN_TIME=0.3 GGML_MODES=router \
        BUSY_PCT=25 RETRIES=1 "$ROOT/bench/peers/ggml_cpu/compare.sh" >"$d/compare.log" 2>&1
    for act in f32 q8; do
        for t in 1 2; do
            echo "   $act t=$t $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"
            MOEKIT_CPU_ACT=$act RAYON_NUM_THREADS=$t "$MOEKIT" bench --device cpu --preset qwen3-30b-a3b \
                --format $ALL --tokens 1,8 --min-time 0.3 --json "$d/${act}_t$t.json" >"$d/${act}_t$t.txt" 2>&1
        done
    done
done
echo "== done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/log.txt"

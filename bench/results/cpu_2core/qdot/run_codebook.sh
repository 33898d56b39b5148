#!/usr/bin/env bash
# The measurements of bench/results/cpu_2core/qdot/2026-11-24d_codebook.md:
# ROUNDS alternating rounds of `moekit bench` (qwen3-30b-a3b, T = 1 and 8,
# 2 threads, default activations) with the binary before the codebook
# integer kernels (BEFORE) and after (AFTER), each run's JSON, its load
# average and the other processes' CPU share (top) logged.
#
#   BEFORE=/path/moekit AFTER=target/release/moekit \
#     bench/results/cpu_2core/qdot/run_codebook.sh OUT_DIR [ROUNDS]
set -euo pipefail
OUT="$(realpath -m "$1")"
ROUNDS="${2:-3}"
FORMATS=iq4_nl,iq4_xs,mxfp4,mlx-mxfp4,mlx-nvfp4,q4_0
mkdir -p "$OUT"
others() { top -bn1 | awk 'NR > 7 && $12 != "moekit" { s += $9 } END { printf "%.0f", s }'; }
for r in $(seq 1 "$ROUNDS"); do
    for which in before after; do
        bin=$BEFORE; [ "$which" = after ] && bin=$AFTER
        echo "round $r $which $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) others% $(others)" | tee -a "$OUT/log.txt"
        RAYON_NUM_THREADS=2 "$bin" bench --device cpu --preset qwen3-30b-a3b --format $FORMATS \
            --tokens 1,8 --min-time 0.5 --json "$OUT/${which}_round$r.json" >"$OUT/${which}_round$r.txt" 2>&1
        echo "   end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) others% $(others)" | tee -a "$OUT/log.txt"
    done
done

#!/usr/bin/env bash
# run1's bundle again: the traces (fused on/off) and an ncu look at the
# fused kernel against the gate/up and down kernels it replaces.
set -u
res=/tmp/res; mkdir -p $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
xz -dc gpu-bundle/xz/moekit.xz > /tmp/moekit; chmod +x /tmp/moekit
b() { timeout 150 /tmp/moekit bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
for f in 0 1; do
  MOEKIT_TRACE=1 MOEKIT_DECODE_FUSED=$f b --preset qwen3-30b-a3b --format affine4 --tokens 1 --path decode > $res/trace_f$f.txt 2>&1
done
sed -n '/single replay/,/^$/p' $res/trace_f0.txt | grep -E "gate/up|down|tail"
sed -n '/single replay/,/^$/p' $res/trace_f1.txt | grep -E "gate/up|down|tail"
S="--section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis"
for f in 0 1; do
  MOEKIT_DECODE_FUSED=$f timeout 200 ncu $S --kernel-name regex:"decode_(fused|gate|down)" --launch-skip 6 --launch-count 3 /tmp/moekit bench --device cuda --dtype bf16 --min-time 0.01 --preset qwen3-30b-a3b --format affine4 --tokens 1 --path decode > $res/ncu_f$f.txt 2>&1
  grep -E "decode_|Duration|Warp Cycles Per Issued|Stall|Registers Per|Achieved Occ|DRAM Through|Shared Memory Configuration" $res/ncu_f$f.txt | head -40
done
tar czf ${OUT:-/tmp/out}/res.tgz -C $res .
echo "all $(( $(date +%s) - t0 )) s"

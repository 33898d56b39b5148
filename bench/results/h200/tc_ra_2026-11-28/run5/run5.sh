#!/usr/bin/env bash
# Final tree: GPU tests tc::, tc_ra::, moe:: (+ sanitizer on tc_ra), and the
# 256-row rule on mixtral T = 4096 (planner's path).
out=$1; mkdir -p $out; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $out/device.txt
SANITIZE=1 bash gpu-bundle/run.sh tc_ra::sanitizer_sweep 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" > $out/sanitizer.txt
gpu-bundle/moekit bench --device cuda --dtype bf16 --preset mixtral-8x7b --format affine4,q4_k --tokens 512,4096 --min-time 0.05 > $out/mixtral.txt 2>&1
echo "bench done $(( $(date +%s) - t0 )) s"
timeout 420 bash gpu-bundle/run.sh tc_ra:: tc:: moe:: 2>&1 | grep -E "^test |test result|panicked|NMSE" > $out/tests.txt
cat $out/device.txt $out/sanitizer.txt $out/tests.txt
grep -E "^[a-z0-9_-]+ +[0-9]+ " $out/mixtral.txt | awk '{print $1,$2,$9,$NF}'

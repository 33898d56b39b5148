#!/usr/bin/env bash
# tc_ra with the weights staged in shared memory (WS) against the register
# loads: GPU tests of both schedules, a same-call A/B of the planner's
# tensor-core path (qwen3-30b-a3b, alternating twice), compute-sanitizer.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .*(ok|FAILED)$|test result|panicked|ERROR SUMMARY|RACECHECK SUMMARY" "$1" | grep -v " ok$" ; grep -c " ok$" "$1"; }
timeout 240 $T --test-threads=1 tc_ra:: > "$out/tests_default.txt" 2>&1; echo "default tests ($(( $(date +%s) - t0 )) s):"; summ "$out/tests_default.txt"
MOEKIT_TC_RA_WS=1 timeout 120 $T --test-threads=1 tc_ra:: tc::block > "$out/tests_ws.txt" 2>&1; echo "WS tests ($(( $(date +%s) - t0 )) s):"; summ "$out/tests_ws.txt"
for r in 1 2; do for ws in 0 1; do
  MOEKIT_TC_RA_WS=$ws timeout 100 ./gpu-bundle/moekit bench --device cuda --dtype bf16 --preset qwen3-30b-a3b \
    --format affine4,q4_k,affine8,iq4_xs,q4_0,mxfp4 --tokens 64,512,4096 --min-time 0.05 --json "$out/b_ws${ws}_r$r.json" > "$out/b_ws${ws}_r$r.txt" 2>&1
done; done
echo "bench ($(( $(date +%s) - t0 )) s):"
for f in "$out"/b_ws*_r*.txt; do echo "$(basename $f)"; grep -E "^[a-z0-9_-]+ +[0-9]+ " "$f" | awk '{printf "%s/%s %s  ", $1, $2, $9} END {print ""}'; done
for tool in memcheck racecheck; do
  MOEKIT_TC_RA_WS=1 timeout 150 compute-sanitizer --tool $tool $T --test-threads=1 tc_ra::sanitizer_sweep > "$out/san_$tool.txt" 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" "$out/san_$tool.txt" | tr '\n' ' ')"
done
echo "all $(( $(date +%s) - t0 )) s"

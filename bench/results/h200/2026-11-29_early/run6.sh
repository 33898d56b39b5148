#!/usr/bin/env bash
# Twentieth session, sixth call (review commit): one-token rank counts through
# one helper (decode_routing.cuh chosen_below: select_expert and the routing's
# T = 1 sort), tc_ra's dead width test dropped, unpermute's source address
# tidied. Same SASS sizes here; GPU tests and compute-sanitizer of the three.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc_new
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kc_new.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test |test result|panicked at|NMSE|differ|not finite" "$1" | head -20; }
save() { tar czf "$out/res.tgz" -C $res .; }
timeout 200 $T --test-threads=1 decode:: permute:: tc_ra::narrow_tiles tc_ra::sanitizer_sweep > $res/tests.txt 2>&1; echo "tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests.txt; save
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 $T --test-threads=1 decode::gate_up_blocks_route decode::sanitizer_sweep permute:: > $res/san_$tool.txt 2>&1
  echo "$tool ($(( $(date +%s) - t0 )) s): $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
  save
done
echo "all $(( $(date +%s) - t0 )) s"

#!/bin/bash
# GPU suite groups not run in ab2.sh, the fixed route_sort test, and
# compute-sanitizer on the tensor-core sweep.
set -u
export MOEKIT_CACHE_DIR=/tmp/mk; mkdir -p $MOEKIT_CACHE_DIR $OUT
t0=$(date +%s)
[ -f /tmp/mk/.new2 ] || { gpu-bundle/new/warm_cache '' > /tmp/warm.log 2>&1; tail -1 /tmp/warm.log; touch /tmp/mk/.new2; }
echo "warm: $(( $(date +%s) - t0 )) s"
T=gpu-bundle/new/moekit-gpu-tests
timeout 280 $T --test-threads=1 route_sort gather_mm norm_act permute > $OUT/tests.log 2>&1; echo "tests rc $?"
grep -E "test result|FAILED|panicked" $OUT/tests.log | head
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 $T --test-threads=1 tc::sanitizer_sweep > $OUT/san_$tool.log 2>&1; echo "$tool rc $?"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $OUT/san_$tool.log
done
echo "total: $(( $(date +%s) - t0 )) s"

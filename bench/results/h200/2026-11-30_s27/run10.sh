#!/usr/bin/env bash
# The final tree (the early routing read at T = 1): every GPU decode:: test
# (every format, rule and layout against the CPU; fold vs tail; batch
# invariance; mixed-format layers) and compute-sanitizer on the sweep.
set -u
res=/tmp/res10; rm -rf $res; mkdir -p $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc10; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
xz -dc gpu-bundle/xz/gt.xz > /tmp/gt; chmod +x /tmp/gt
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 420 /tmp/gt --test-threads=1 decode:: > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt
grep -E "^test " $res/tests_decode.txt | head -20
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool /tmp/gt --test-threads=1 decode::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
tar czf ${OUT:-/tmp/out}/res.tgz -C $res .
echo "all $(( $(date +%s) - t0 )) s"

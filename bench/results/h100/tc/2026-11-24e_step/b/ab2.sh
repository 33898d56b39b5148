#!/bin/bash
# Second A/B (16-row tiles' mma.sync loop unrolled too) and the GPU suite.
set -u
export MOEKIT_CACHE_DIR=/tmp/mk; mkdir -p $MOEKIT_CACHE_DIR $OUT
[ -f /tmp/mk/.old ] || { tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR; touch /tmp/mk/.old; }
t0=$(date +%s)
[ -f /tmp/mk/.new2 ] || { gpu-bundle/new/warm_cache '' > /tmp/warm.log 2>&1; tail -1 /tmp/warm.log; touch /tmp/mk/.new2; }
echo "warm: $(( $(date +%s) - t0 )) s"
if [ "${BENCH:-1}" = 1 ]; then
for round in 1 2; do
 for v in old new; do
  b=gpu-bundle/moekit; [ $v = new ] && b=gpu-bundle/new/moekit
  $b bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 64,512,4096 --min-time 0.2 --json $OUT/${v}_$round.json > $OUT/${v}_$round.txt 2>&1
 done
done
echo "bench: $(( $(date +%s) - t0 )) s"
fi
timeout ${TT:-300} gpu-bundle/new/moekit-gpu-tests --test-threads=1 ${FILTER:-} > $OUT/tests.txt 2>&1; echo "tests rc $?"
grep -E "test result|FAILED|panicked|failed" $OUT/tests.txt | head -20
echo "total: $(( $(date +%s) - t0 )) s"

#!/bin/bash
# A/B of the tc_gemm step rewrite: old bundle binary vs new, same run.
set -u
export MOEKIT_CACHE_DIR=/tmp/mk; mkdir -p $MOEKIT_CACHE_DIR
tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=gpu-bundle/new/warm_cache
t0=$(date +%s)
$W '' > /tmp/warm.log 2>&1; tail -2 /tmp/warm.log
echo "warm: $(( $(date +%s) - t0 )) s"
export MOEKIT_CACHE_DIR
mkdir -p $OUT
for round in 1 2; do
 for v in old new; do
  b=gpu-bundle/moekit; [ $v = new ] && b=gpu-bundle/new/moekit
  $b bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 64,512,4096 --min-time 0.2 --json $OUT/${v}_$round.json > $OUT/${v}_$round.txt 2>&1
  echo "== $v round $round"; grep -E "^\|? *[0-9]|µs|ms" $OUT/${v}_$round.txt | head -20
 done
done
if [ "${TESTS:-1}" = 1 ]; then
  timeout 250 gpu-bundle/new/moekit-gpu-tests --test-threads=1 tc:: 2>&1 | tail -15
fi

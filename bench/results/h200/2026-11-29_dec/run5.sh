#!/usr/bin/env bash
# Final tree (issue 10): the select-only fold routing alone (the router x-load
# hoist and the early weight head were reverted). Base (d81f049) vs final,
# GPU decode:: tests, the family blocks on every CUDA path, compute-sanitizer.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
b() { local bin=$1; shift; timeout 120 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q4_0,q8_0,bf16 --tokens 1,2,4,8 --path decode"
b gpu-bundle/moekit.base $Q --json $res/base.json > $res/base.txt 2>&1; echo "base: $(row $res/base.txt)"
b gpu-bundle/moekit $Q --json $res/final.json > $res/final.txt 2>&1; echo "final: $(row $res/final.txt)"
for p in deepseek-v2-lite gpt-oss-20b qwen3-next-80b mixtral-8x7b; do
  b gpu-bundle/moekit --preset $p --format affine4,q4_k --tokens 1 --path decode > $res/${p}.txt 2>&1; echo "$p: $(row $res/${p}.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 170 $T --test-threads=1 decode:: > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt
for tool in memcheck racecheck; do
  timeout 80 compute-sanitizer --tool $tool $T --test-threads=1 decode::gate_up_blocks_route decode::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
timeout 100 $T --test-threads=1 moe::family_blocks > $res/tests_family.txt 2>&1; echo "family ($(( $(date +%s) - t0 )) s):"; summ $res/tests_family.txt
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

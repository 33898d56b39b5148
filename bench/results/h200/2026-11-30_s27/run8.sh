#!/usr/bin/env bash
# The early routing read of decode_down_mma at every T of the decode path
# (T > 1: published by decode_route_tail): MOEKIT_DECODE_EARLY=0 vs 1, same
# binary, alternated; GPU tests and compute-sanitizer.
set -u
res=/tmp/res8; rm -rf $res; mkdir -p $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc8; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
xz -dc gpu-bundle/xz/moekit.xz > /tmp/moekit; xz -dc gpu-bundle/xz/gt.xz > /tmp/gt; chmod +x /tmp/moekit /tmp/gt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
b() { timeout 150 /tmp/moekit bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s %s %s/%s (%s) ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 1,2,4,8,16 --path decode"
for r in 1 2; do for f in 0 1; do
  MOEKIT_DECODE_EARLY=$f b $Q --json $res/q_e${f}_r$r.json > $res/q_e${f}_r$r.txt 2>&1; echo "early=$f r$r: $(row $res/q_e${f}_r$r.txt)"
done; done
for p in deepseek-v2-lite gpt-oss-20b qwen3-next-80b mixtral-8x7b; do for f in 0 1; do
  MOEKIT_DECODE_EARLY=$f b --preset $p --format affine4 --tokens 1,8 --path decode > $res/${p}_e$f.txt 2>&1; echo "$p early=$f: $(row $res/${p}_e$f.txt)"
done; done
echo "($(( $(date +%s) - t0 )) s)"
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 200 /tmp/gt --test-threads=1 decode::gate_up_blocks decode::decode_is_det decode::long_k > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool /tmp/gt --test-threads=1 decode::gate_up_blocks > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
tar czf ${OUT:-/tmp/out}/res.tgz -C $res .
echo "all $(( $(date +%s) - t0 )) s"

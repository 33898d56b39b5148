#!/usr/bin/env bash
# Decode, final tree (issue 10): base (d81f049) vs the select-only fold
# routing + the first two spans' weights issued before the token lookups
# GPU decode:: tests, the family blocks on every CUDA path, compute-sanitizer.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
b() { local bin=$1; shift; timeout 120 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s ", $1, $2, $9*1000, $13*1000}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 1,2,4,8 --path decode"
for r in 1 2; do
  b gpu-bundle/moekit.base $Q > $res/base_r$r.txt 2>&1; echo "base r$r: $(row $res/base_r$r.txt)"
  b gpu-bundle/moekit $Q > $res/new_r$r.txt 2>&1; echo "new  r$r: $(row $res/new_r$r.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"
for p in mixtral-8x7b deepseek-v2-lite gpt-oss-20b qwen3-next-80b; do
  b gpu-bundle/moekit.base --preset $p --format affine4,q4_k --tokens 1,8 --path decode > $res/${p}_base.txt 2>&1; echo "$p base: $(row $res/${p}_base.txt)"
  b gpu-bundle/moekit --preset $p --format affine4,q4_k --tokens 1,8 --path decode > $res/${p}_new.txt 2>&1; echo "$p new:  $(row $res/${p}_new.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"
timeout 100 python3 bench/peers/torch_moe.py --preset qwen3-30b-a3b --tokens 1,2,4,8 --impl grouped_mm --modes graph > $res/torch_qwen3.txt 2>&1
echo "torch qwen3: $(grep -E "grouped_mm graph" $res/torch_qwen3.txt | tr '\n' ' ')"
for t in 1 8; do
  MOEKIT_TRACE=1 b gpu-bundle/moekit --preset qwen3-30b-a3b --format affine4 --tokens $t --path decode > $res/trace_$t.txt 2>&1
  echo "== trace T=$t"; sed -n '/decode trace/,/down combined/p' $res/trace_$t.txt | head -19 | grep -v "none$"
done
echo "($(( $(date +%s) - t0 )) s)"
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 150 $T --test-threads=1 decode:: > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool $T --test-threads=1 decode::gate_up_blocks_route decode::long_k decode::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
timeout 150 $T --test-threads=1 moe::family_blocks > $res/tests_family.txt 2>&1; echo "family ($(( $(date +%s) - t0 )) s):"; summ $res/tests_family.txt
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

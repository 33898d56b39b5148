#!/usr/bin/env bash
# Final tree: GPU tests (tc_ra, tc, moe, decode), compute-sanitizer of the
# tc_ra sweep, the 128/256-row A/B once more (32-bit B sources), and the
# planner's tables beside torch._grouped_mm (qwen3, mixtral, deepseek).
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 200 $T --test-threads=1 tc_ra:: tc:: > $res/tests_tc.txt 2>&1; echo "tc tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_tc.txt
M=./gpu-bundle/moekit
b() { timeout 120 $M bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
for cap in 128 256; do
  MOEKIT_TC_RA_TILE=$cap b --preset qwen3-30b-a3b --format affine4,q4_k,affine8,iq4_xs --tokens 4096 --json $res/q_cap$cap.json > $res/q_cap$cap.txt 2>&1
done
b --preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 1,8,16,64,512,4096 --json $res/qwen3.json > $res/qwen3.txt 2>&1
for p in mixtral-8x7b deepseek-v2-lite; do
  b --preset $p --format affine4,q4_k,bf16 --tokens 64,512,4096 --json $res/$p.json > $res/$p.txt 2>&1
done
echo "bench ($(( $(date +%s) - t0 )) s):"
for f in $res/q_cap*.txt $res/qwen3.txt $res/mixtral-8x7b.txt $res/deepseek-v2-lite.txt; do echo "$(basename $f .txt): $(grep -E "^[a-z0-9_-]+ +[0-9]+ " "$f" | awk '{printf "%s/%s %s (%s) ", $1, $2, $9, $12}')"; done
for p in qwen3-30b-a3b mixtral-8x7b deepseek-v2-lite; do
  timeout 100 python3 bench/peers/torch_moe.py --preset $p --tokens 64,512,4096 --impl grouped_mm --modes graph > $res/torch_$p.txt 2>&1
  echo "torch $p: $(grep -E "grouped_mm graph" $res/torch_$p.txt | tr '\n' ' ')"
done
echo "torch ($(( $(date +%s) - t0 )) s)"
timeout 100 compute-sanitizer --tool memcheck $T --test-threads=1 tc_ra::sanitizer_sweep > $res/san_memcheck.txt 2>&1
echo "memcheck: $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' ' ')"
timeout 150 $T --test-threads=1 moe:: > $res/tests_moe.txt 2>&1; echo "moe tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_moe.txt
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

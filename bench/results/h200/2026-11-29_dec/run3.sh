#!/usr/bin/env bash
# Decode A/B (issue 10), second round: base (d81f049) vs the select-only fold
# routing + the router's x loads issued for the whole token group (no L2
# prefetch: it lost in run2); span-split knobs at T = 1; ncu of T = 1's
# expert kernels; GPU decode:: tests and compute-sanitizer.
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
Q1="--preset qwen3-30b-a3b --format affine4,q4_k,bf16 --tokens 1 --path decode"
MOEKIT_DECODE_SPANS=2 b gpu-bundle/moekit $Q1 > $res/s2.txt 2>&1; echo "spans2: $(row $res/s2.txt)"
MOEKIT_DECODE_SPANS=2 MOEKIT_DECODE_FOLD_BLOCKS=4 b gpu-bundle/moekit $Q1 > $res/s2f4.txt 2>&1; echo "spans2 fold4: $(row $res/s2f4.txt)"
MOEKIT_DECODE_SPANS=8 b gpu-bundle/moekit $Q1 > $res/s8.txt 2>&1; echo "spans8: $(row $res/s8.txt)"
echo "($(( $(date +%s) - t0 )) s)"
for p in mixtral-8x7b deepseek-v2-lite gpt-oss-20b qwen3-next-80b; do
  b gpu-bundle/moekit.base --preset $p --format affine4,q4_k --tokens 1,8 --path decode > $res/${p}_base.txt 2>&1; echo "$p base: $(row $res/${p}_base.txt)"
  b gpu-bundle/moekit --preset $p --format affine4,q4_k --tokens 1,8 --path decode > $res/${p}_new.txt 2>&1; echo "$p new:  $(row $res/${p}_new.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"
for t in 1 8; do
  MOEKIT_TRACE=1 b gpu-bundle/moekit --preset qwen3-30b-a3b --format affine4 --tokens $t --path decode > $res/trace_$t.txt 2>&1
  echo "== trace T=$t"; sed -n '/decode trace/,/down combined/p' $res/trace_$t.txt | head -19 | grep -v "none$"
done
timeout 120 ncu --kernel-name regex:decode_ --launch-skip 6 --launch-count 3 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy \
  gpu-bundle/moekit bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4 --tokens 1 --path decode --min-time 0.001 > $res/ncu_t1.txt 2>&1
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Stall|Warp Cycles Per Issued|No Eligible|Active Warps Per|Issued Warp|L2 Hit|Mem Busy|Max Bandwidth" $res/ncu_t1.txt | head -60
echo "($(( $(date +%s) - t0 )) s)"
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 150 $T --test-threads=1 decode:: > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool $T --test-threads=1 decode::gate_up_blocks_route decode::router_matvec decode::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

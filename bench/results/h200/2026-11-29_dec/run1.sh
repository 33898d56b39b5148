#!/usr/bin/env bash
# Baseline decode timeline on the H200 (issue 10): MOEKIT_TRACE stamps at
# T = 1/2/4/8, graph times, and ncu of the T = 1 kernels in isolation.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
M=./gpu-bundle/moekit
b() { timeout 120 $M bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
b --preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 1,2,4,8 --path decode --json $res/base.json > $res/base.txt 2>&1
grep -E "^[a-z0-9_-]+ +[0-9]+ " $res/base.txt | awk '{printf "%s/%s g %s b2b %s (%s)\n", $1, $2, $9, $13, $12}'
echo "($(( $(date +%s) - t0 )) s)"
for f in affine4 q4_k; do for t in 1 8; do
  MOEKIT_TRACE=1 b --preset qwen3-30b-a3b --format $f --tokens $t --path decode > $res/trace_${f}_$t.txt 2>&1
  echo "== trace $f T=$t"; sed -n '/decode trace/,/down combined/p' $res/trace_${f}_$t.txt | head -19
done; done
MOEKIT_TRACE=1 MOEKIT_DECODE_FOLD=0 b --preset qwen3-30b-a3b --format affine4 --tokens 1 --path decode > $res/trace_nofold.txt 2>&1
echo "== trace nofold affine4 T=1"; sed -n '/decode trace/,/down combined/p' $res/trace_nofold.txt | head -19
echo "($(( $(date +%s) - t0 )) s)"
timeout 150 ncu --kernel-name regex:decode --launch-skip 8 --launch-count 6 --section SpeedOfLight --section Occupancy --section LaunchStats \
  $M bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4 --tokens 1 --path decode --min-time 0.001 > $res/ncu_t1.txt 2>&1
grep -E "decode_|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Grid Size" $res/ncu_t1.txt | head -40
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Where the fused kernel's time goes (qwen3 affine4 T = 1): ncu stall
# reasons of decode_fused_mma against decode_gate_up_mma / decode_down_mma,
# and the SASS-level stall samples of the fused kernel.
set -u
res=/tmp/res6; rm -rf $res; mkdir -p $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc6; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
xz -dc gpu-bundle/xz/moekit.xz > /tmp/moekit; chmod +x /tmp/moekit
for f in 1 0; do
  MOEKIT_DECODE_FUSED=$f M=/tmp/moekit KERNEL="decode_(fused|gate_up_mma|down_mma)" PATHSEL=decode SOURCE=0 CASES="affine4:1" OUT=$res/m$f bash bench/profile/ra_stalls.sh 2>&1 | tail -8
done
MOEKIT_DECODE_FUSED=1 ncu --section WarpStateStats --section SourceCounters --import-source no --kernel-name regex:decode_fused --launch-skip 4 --launch-count 1 \
  -o $res/fused -f /tmp/moekit bench --preset qwen3-30b-a3b --format affine4 --tokens 1 --device cuda --dtype bf16 --min-time 0 --path decode > /dev/null 2>&1
ncu -i $res/fused.ncu-rep --page source --print-source sass --csv > $res/sass_fused.csv 2>&1
python3 bench/profile/ncu_hot.py < $res/sass_fused.csv | head -24
rm -f $res/fused.ncu-rep
xz -9 $res/sass_fused.csv
tar czf ${OUT:-/tmp/out}/res.tgz -C $res .
echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Decode vs tensor-core crossover after the sort change (qwen3, H200).
OUTD=${OUT:-/tmp/out}; out=/tmp/prof; mkdir -p $out $OUTD
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
gpu-bundle/warm_cache tc_ra __nv_bfloat16 2>&1 | tail -1; gpu-bundle/warm_cache FmtQ4_0 __nv_bfloat16 2>&1 | tail -1
nvidia-smi --query-gpu=name --format=csv,noheader | tee $out/device.txt
m=gpu-bundle/moekit
for r in 1 2; do for path in decode tc; do
  $m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,q4_0,q8_0 --tokens 8,12,16,20,24,32,40 --path $path --min-time 0.05 > $out/x_${path}_$r.txt 2>&1
done; done
for r in 1 2; do paste <(grep -E "^[a-z0-9_-]+ +[0-9]+ " $out/x_decode_$r.txt | awk '{print $1,$2,$9}') <(grep -E "^[a-z0-9_-]+ +[0-9]+ " $out/x_tc_$r.txt | awk '{print $9}'); done
tar czf $OUTD/prof.tgz -C $out .

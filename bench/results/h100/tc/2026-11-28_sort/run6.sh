#!/usr/bin/env bash
# Final tree on an H100: the qwen3 planner table beside torch (compare with the twelfth session's H100 run4).
OUTD=${OUT:-/tmp/out}; out=/tmp/prof; mkdir -p $out $OUTD; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $out/device.txt
m=gpu-bundle/moekit
$m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 1,8,16,64,512,4096 --min-time 0.1 --json $out/qwen3.json > $out/qwen3.txt 2>&1
python3 bench/peers/torch_moe.py --preset qwen3-30b-a3b --tokens 16,64,512,4096 --impl grouped_mm --modes graph > $out/torch_qwen3.txt 2>&1
echo "qwen3 done $(( $(date +%s) - t0 )) s"
tar czf $OUTD/prof.tgz -C $out .

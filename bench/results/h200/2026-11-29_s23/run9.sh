#!/usr/bin/env bash
# Ninth call: the final tree's table for the closing note: qwen3-30b-a3b
# (affine4, q4_k, q8_0, bf16) at T = 1 … 4096 and Mixtral-8x7b (affine4,
# q4_k, bf16) at T = 64, 512, 4096, beside torch._grouped_mm (graph) in the
# same call.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; xz -dc gpu-bundle/xz/moekit.xz > /tmp/bin/moekit; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
timeout 200 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 1,8,16,64,512,4096 --json $res/qwen3.json > $res/qwen3.txt 2>&1
echo "qwen3: $(row $res/qwen3.txt) ($(( $(date +%s) - t0 )) s)"; save
timeout 60 python3 bench/peers/torch_moe.py --preset qwen3-30b-a3b --tokens 16,64,512,4096 --impl grouped_mm --modes graph > $res/torch_qwen3.txt 2>&1
echo "torch qwen3: $(grep -E "grouped_mm" $res/torch_qwen3.txt | tr -s ' ' | head -6 | tr '\n' '|')"; save
timeout 120 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset mixtral-8x7b --format affine4,q4_k,bf16 --tokens 64,512,4096 --json $res/mixtral.json > $res/mixtral.txt 2>&1
echo "mixtral: $(row $res/mixtral.txt) ($(( $(date +%s) - t0 )) s)"; save
timeout 60 python3 bench/peers/torch_moe.py --preset mixtral-8x7b --tokens 64,512,4096 --impl grouped_mm --modes graph > $res/torch_mixtral.txt 2>&1
echo "torch mixtral: $(grep -E "grouped_mm" $res/torch_mixtral.txt | tr -s ' ' | head -6 | tr '\n' '|')"; save
echo "all $(( $(date +%s) - t0 )) s"

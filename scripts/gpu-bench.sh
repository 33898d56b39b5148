#!/usr/bin/env bash
# The benchmark set behind the README's GPU table, on a CUDA machine after
# `bash scripts/gpu-bundle.sh` (no Rust needed there): moekit's decode cases,
# every format at T = 1, the PyTorch peers on the same shapes, and the other
# presets. JSON files go to the folder given (default bench-out/).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out}
mkdir -p "$out"
export MOEKIT_CACHE_DIR=${MOEKIT_CACHE_DIR:-/tmp/moekit-kernels}
m=gpu-bundle/moekit
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee "$out/device.txt"
$m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k \
  --tokens 1,2,4,8,16,32,64 --min-time 0.2 --json "$out/moekit_qwen3-30b-a3b.json"
$m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format all --tokens 1 --min-time 0.1 \
  --json "$out/moekit_qwen3-30b-a3b_all_t1.json"
# The tensor-core table (path chosen by the planner) and the crossover.
$m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,bf16,q8_0 \
  --tokens 1,8,16,64,512,4096 --min-time 0.05 --json "$out/moekit_qwen3-30b-a3b_tc.json"
for path in decode tc; do
  $m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,bf16,q8_0 --path $path \
    --tokens 4,8,16 --min-time 0.05 --json "$out/crossover_$path.json"
done
python3 bench/peers/torch_moe.py --preset qwen3-30b-a3b --tokens 1,2,8,16,64,512,4096 --repeats 20 \
  --json "$out/torch_qwen3-30b-a3b.json"
for p in mixtral-8x7b deepseek-v2-lite gpt-oss-20b qwen3-next-80b; do
  $m bench --device cuda --dtype bf16 --preset "$p" --format affine4,q4_k,bf16 --tokens 1,8,512,4096 \
    --min-time 0.05 --json "$out/moekit_$p.json"
  python3 bench/peers/torch_moe.py --preset "$p" --tokens 512,4096 --repeats 10 --json "$out/torch_$p.json"
done

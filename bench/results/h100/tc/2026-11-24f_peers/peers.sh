#!/bin/bash
# moekit (this build, planner's path) beside torch._grouped_mm (graph), same
# device call, every preset; stops starting presets after LIMIT seconds.
set -u
export MOEKIT_CACHE_DIR=/tmp/mk; mkdir -p $MOEKIT_CACHE_DIR $OUT
t0=$(date +%s)
[ -f /tmp/mk/.new2 ] || { gpu-bundle/new/warm_cache '' > /tmp/warm.log 2>&1; tail -1 /tmp/warm.log; touch /tmp/mk/.new2; }
echo "warm: $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > $OUT/device.txt
for p in ${PRESETS:-qwen3-30b-a3b mixtral-8x7b deepseek-v2-lite gpt-oss-20b qwen3-next-80b}; do
  if [ $(( $(date +%s) - t0 )) -gt ${LIMIT:-430} ]; then echo "skip $p"; continue; fi
  f=affine4,q4_k,bf16; [ $p = qwen3-30b-a3b ] && f=affine4,q4_k,q8_0,bf16,q4_0,affine8
  gpu-bundle/new/moekit bench --device cuda --dtype bf16 --preset $p --format $f --tokens 1,8,16,64,512,4096 --min-time 0.1 --json $OUT/moekit_$p.json > $OUT/moekit_$p.txt 2>&1
  python3 bench/peers/torch_moe.py --preset $p --tokens 16,64,512,4096 --impl grouped_mm --modes graph --json $OUT/torch_$p.json > $OUT/torch_$p.txt 2>&1
  echo "$p done at $(( $(date +%s) - t0 )) s"
done
cd $OUT && tar czf /tmp/peers.tgz * && rm -f * && mv /tmp/peers.tgz $OUT/

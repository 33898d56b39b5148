#!/usr/bin/env bash
# Final tree: tests, the planner's qwen3 table beside torch._grouped_mm, and
# staged vs tc_ra (table) on the other presets, one device call.
out=$1; mkdir -p $out; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $out/device.txt
bash gpu-bundle/run.sh tc_ra:: tc::block 2>&1 | grep -E "^test |test result|panicked|NMSE" > $out/tests.txt
m=gpu-bundle/moekit
$m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16,q4_0,iq4_xs --tokens 1,8,16,64,512,4096 --min-time 0.1 --json $out/qwen3.json > $out/qwen3.txt 2>&1
python3 bench/peers/torch_moe.py --preset qwen3-30b-a3b --tokens 16,64,512,4096 --impl grouped_mm --modes graph > $out/torch_qwen3.txt 2>&1
echo "qwen3 done $(( $(date +%s) - t0 )) s"
for p in mixtral-8x7b deepseek-v2-lite qwen3-next-80b; do
  for v in 0 1; do
    MOEKIT_TC_RA=$v $m bench --device cuda --dtype bf16 --preset $p --format affine4,q4_k --tokens 64,512,4096 --path tc --min-time 0.05 >> $out/presets_ra$v.txt 2>&1
  done
  echo "$p done $(( $(date +%s) - t0 )) s"
done
cat $out/tests.txt
grep -E "^[a-z0-9_-]+ +[0-9]+ " $out/qwen3.txt | awk '{print $1,$2,$9,$13,$NF}'
grep -iE "grouped|graph|^ *T|ms" $out/torch_qwen3.txt | tail -8
paste <(grep -E "^preset|^[a-z0-9_-]+ +[0-9]+ " $out/presets_ra0.txt | awk '{print $1,$2,$9}') <(grep -E "^preset|^[a-z0-9_-]+ +[0-9]+ " $out/presets_ra1.txt | awk '{print $9}')

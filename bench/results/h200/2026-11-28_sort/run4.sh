#!/usr/bin/env bash
# Block-per-range sort: tests (+ sanitizer), sort kernel times (ncu), the
# planner's tables for every preset beside torch._grouped_mm, same call.
OUTD=${OUT:-/tmp/out}; out=/tmp/prof; mkdir -p $out $OUTD; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $out/device.txt
m=gpu-bundle/moekit
SANITIZE=1 bash gpu-bundle/run.sh route_sort::sort 2>&1 | grep -E "^test |test result|panicked|ERROR SUMMARY|RACECHECK SUMMARY|compute-sanitizer" > $out/tests.txt
echo "tests done $(( $(date +%s) - t0 )) s"; cat $out/tests.txt
K='regex:sort'
for T in 64 512 4096; do
  ncu --clock-control none -k "$K" --launch-skip 12 --launch-count 6 --metrics gpu__time_duration.sum --csv \
    $m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4 --tokens $T --path tc --min-time 0.001 > $out/k_affine4_T$T.csv 2>&1
done
echo "ncu done $(( $(date +%s) - t0 )) s"
$m bench --device cuda --dtype bf16 --preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 1,8,16,64,512,4096 --min-time 0.1 --json $out/qwen3.json > $out/qwen3.txt 2>&1
python3 bench/peers/torch_moe.py --preset qwen3-30b-a3b --tokens 16,64,512,4096 --impl grouped_mm --modes graph > $out/torch_qwen3.txt 2>&1
echo "qwen3 done $(( $(date +%s) - t0 )) s"
grep -E "^[a-z0-9_-]+ +[0-9]+ " $out/qwen3.txt | awk '{print $1,$2,$9,$13,$NF}'
grep -E "grouped_mm graph" $out/torch_qwen3.txt
for p in mixtral-8x7b deepseek-v2-lite gpt-oss-20b qwen3-next-80b; do
  $m bench --device cuda --dtype bf16 --preset $p --format affine4,q4_k,bf16 --tokens 1,16,64,512,4096 --min-time 0.05 --json $out/$p.json > $out/$p.txt 2>&1
  python3 bench/peers/torch_moe.py --preset $p --tokens 16,64,512,4096 --impl grouped_mm --modes graph > $out/torch_$p.txt 2>&1
  echo "$p done $(( $(date +%s) - t0 )) s"
  grep -E "^[a-z0-9_-]+ +[0-9]+ |skipped" $out/$p.txt | awk '{print $1,$2,$9,$13,$NF}'
  grep -E "grouped_mm graph" $out/torch_$p.txt
done
tar czf $OUTD/prof.tgz -C $out .

#!/usr/bin/env bash
# gpt-oss-20b bf16 with GLU_ROWS (the gate/up on tc_tma only where experts
# average 256 rows or more): T = 512, 2048, 4096, two rounds, and torch.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
xz -dc gpu-bundle/xz/moekit.xz > /tmp/moekit; chmod +x /tmp/moekit
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
for r in 1 2; do
  timeout 60 /tmp/moekit bench --device cuda --dtype bf16 --min-time 0.05 --preset gpt-oss-20b --format bf16 --tokens 512,2048,4096 --json $res/go_$r.json > $res/go_$r.txt 2>&1
  echo "r$r gpt-oss: $(row $res/go_$r.txt) ($(( $(date +%s) - t0 )) s)"
done
timeout 60 python3 bench/peers/torch_moe.py --preset gpt-oss-20b --tokens 512,2048,4096 --impl grouped_mm --modes graph > $res/torch_go.txt 2>&1
echo "torch gpt-oss: $(grep -E "grouped_mm graph" $res/torch_go.txt | tr -s ' ' | tr '\n' '|')"
tar czf "$out/res.tgz" -C $res .; echo "all $(( $(date +%s) - t0 )) s"

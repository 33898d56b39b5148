#!/usr/bin/env bash
# Twenty-second session, seventh call: the final tree's (run6's CLI) other
# presets at T = 64, 512 and 4096 beside torch._grouped_mm (graph) in the
# same call, for issue 9's table.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
for p in mixtral-8x7b deepseek-v2-lite; do
  timeout 100 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset $p --format affine4,q4_k,bf16 --tokens 64,512,4096 --json $res/$p.json > $res/$p.txt 2>&1
  echo "$p: $(row $res/$p.txt) ($(( $(date +%s) - t0 )) s)"; save
  timeout 60 python3 bench/peers/torch_moe.py --preset $p --tokens 64,512,4096 --impl grouped_mm --modes graph > $res/torch_$p.txt 2>&1
  echo "torch $p: $(grep -E "grouped_mm" $res/torch_$p.txt | tr -s ' ' | head -6 | tr '\n' '|')"; save
done
echo "all $(( $(date +%s) - t0 )) s"

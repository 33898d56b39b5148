#!/usr/bin/env bash
# Tenth call: with the cursor, does tc_ra now beat the staged kernel on the
# tiles its table (tc_ra.rs max_tile) leaves to the staged one? Default vs
# MOEKIT_TC_RA=all (tc_ra at every tile), alternated, qwen3.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; xz -dc gpu-bundle/xz/moekit.xz > /tmp/bin/moekit; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format q8_0,q4_0,mxfp4 --tokens 512,4096"
for r in 1 2; do
  timeout 150 $N bench --device cuda --dtype bf16 --min-time 0.05 $Q > $res/table_r$r.txt 2>&1; echo "table r$r: $(row $res/table_r$r.txt) ($(( $(date +%s) - t0 )) s)"
  MOEKIT_TC_RA=all timeout 150 $N bench --device cuda --dtype bf16 --min-time 0.05 $Q > $res/all_r$r.txt 2>&1; echo "all   r$r: $(row $res/all_r$r.txt) ($(( $(date +%s) - t0 )) s)"
  save
done
echo "all $(( $(date +%s) - t0 )) s"

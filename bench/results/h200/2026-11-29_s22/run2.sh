#!/usr/bin/env bash
# Twenty-second session, second call: tc_ra's lookahead L2 prefetch of the
# weight slices (MOEKIT_TC_LOOK spans beyond the two held in registers),
# 0 (off, as before) vs 1, 2, 4, alternated; and the tensor-core path at
# T = 16 and 32 against the decode path the planner takes there.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
b() { local look=$1; shift; MOEKIT_TC_LOOK=$look timeout 200 $N bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) | ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q8_0 --tokens 64,512,4096"
b 0 $Q > $res/warm.txt 2>&1; echo "warm ($(( $(date +%s) - t0 )) s)"
for r in 1 2; do
  for look in 0 1 2 4; do
    b $look $Q --json $res/q_look${look}_r$r.json > $res/q_look${look}_r$r.txt 2>&1; echo "look $look r$r: $(row $res/q_look${look}_r$r.txt)"
  done
  echo "($(( $(date +%s) - t0 )) s)"; save
done
for look in 0 2; do
  b $look --preset mixtral-8x7b --format affine4,q4_k --tokens 64,512 > $res/mixtral_look$look.txt 2>&1; echo "mixtral look $look: $(row $res/mixtral_look$look.txt)"
done
save
for p in decode tc; do
  b 0 --preset qwen3-30b-a3b --format affine4,q4_k --tokens 16,32 --path $p > $res/cross_$p.txt 2>&1; echo "path $p: $(row $res/cross_$p.txt)"
done
save; echo "all $(( $(date +%s) - t0 )) s"

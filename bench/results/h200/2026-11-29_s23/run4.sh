#!/usr/bin/env bash
# Fourth call: MLX 4-bit's scale pairs made at load (alt: HEAD's decoder) or
# where a unit is decoded (new), both on the cursor with the parity-keeping
# clamp, against HEAD (base); qwen3 affine4 on every path, Mixtral.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
b() { local bin=$1; shift; timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
bin() { if [ "$1" = new ]; then echo /tmp/bin/moekit; else echo /tmp/bin/moekit.$1; fi; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) | ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4 --tokens 1,16,64,512,4096"
M="--preset mixtral-8x7b --format affine4 --tokens 64,512"
for r in 1 2; do
  for v in base alt new; do
    b $(bin $v) $Q --json $res/q_${v}_r$r.json > $res/q_${v}_r$r.txt 2>&1; echo "$v r$r: $(row $res/q_${v}_r$r.txt)"
  done
  save
done
for v in base alt new; do
  b $(bin $v) $M --json $res/m_$v.json > $res/m_$v.txt 2>&1; echo "mixtral $v: $(row $res/m_$v.txt)"
done
save; echo "all $(( $(date +%s) - t0 )) s"

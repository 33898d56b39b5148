#!/usr/bin/env bash
# Twenty-second session, sixth call: the K parts counted in the router's
# tile choice (T = 4096: 128-row tiles on 256 blocks instead of 32-row ones
# on 1024) — base (run4's final CLI) vs new, alternated; the router-parts
# test with 2100 tokens (64-row tiles against 16-row ones, bit for bit).
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; B=/tmp/bin/moekit.base; T=/tmp/bin/moekit-gpu-tests; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|differ|not finite" "$1" | head -20; }
b() { local bin=$1; shift; timeout 120 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) | ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k --tokens 512,4096"
for r in 1 2; do
  b $B $Q > $res/q_base_r$r.txt 2>&1; echo "base r$r: $(row $res/q_base_r$r.txt)"
  b $N $Q --json $res/q_new_r$r.json > $res/q_new_r$r.txt 2>&1; echo "new  r$r: $(row $res/q_new_r$r.txt)"
done
save
timeout 100 $T --test-threads=1 tc::router_k_parts > $res/tests_a.txt 2>&1; echo "tests a ($(( $(date +%s) - t0 )) s):"; summ $res/tests_a.txt
save; echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Eighth call: the router's split f32 halves kept per block and dtype
# (RouterHalves) instead of split_hi_lo on every tensor-core call; the block
# test with a block first called under a graph capture; prev (bd8dda7's
# CLI) vs new alternated.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/moekit.xz gpu-bundle/xz/moekit.prev.xz gpu-bundle/xz/moekit-gpu-tests.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; P=/tmp/bin/moekit.prev; T=/tmp/bin/moekit-gpu-tests; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
summ() { grep -E "^test .* (ok|FAILED)$|test result|panicked at|^  left|^ right|differ" "$1" | tail -8; }
b() { local bin=$1; shift; timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) | ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
timeout 200 $T --test-threads=2 tc::block_is_deterministic moe::every_fixture > $res/tests.txt 2>&1; echo "tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests.txt
save
Q="--preset qwen3-30b-a3b --format affine4,q4_k --tokens 32,64,512"
for r in 1 2; do
  b $P $Q > $res/q_prev_r$r.txt 2>&1; echo "prev r$r: $(row $res/q_prev_r$r.txt)"
  b $N $Q --json $res/q_new_r$r.json > $res/q_new_r$r.txt 2>&1; echo "new  r$r: $(row $res/q_new_r$r.txt)"
  save
done
M="--preset mixtral-8x7b --format affine4 --tokens 64"
b $P $M > $res/m_prev.txt 2>&1; echo "mixtral prev: $(row $res/m_prev.txt)"
b $N $M --json $res/m_new.json > $res/m_new.txt 2>&1; echo "mixtral new : $(row $res/m_new.txt)"
save; echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Twenty-second session, fourth call (final tree): the K-parts code only in
# the instances that can take parts (run3's gpt-oss-20b T = 512 was 5%
# slower: every staged instance carried it) — base (run3's moekit.base: PDL,
# lookahead knob, per-expert scales, no K parts) vs final, alternated; the
# GPU tests of the router parts, the per-expert scales (the fixed tc_ra
# tile gate) and batch invariance.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; B=/tmp/bin/moekit.base; T=/tmp/bin/moekit-gpu-tests; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE .*>|differ|not finite" "$1" | head -20; }
b() { local bin=$1; shift; timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) | ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,bf16 --tokens 64,512,4096"
for r in 1 2; do
  b $B --preset gpt-oss-20b --format affine4 --tokens 64,512 > $res/gpt_base_r$r.txt 2>&1; echo "gpt-oss base r$r: $(row $res/gpt_base_r$r.txt)"
  b $N --preset gpt-oss-20b --format affine4 --tokens 64,512 --json $res/gpt_new_r$r.json > $res/gpt_new_r$r.txt 2>&1; echo "gpt-oss new  r$r: $(row $res/gpt_new_r$r.txt)"
done
save
b $B $Q > $res/q_base.txt 2>&1; echo "base: $(row $res/q_base.txt)"
b $N $Q --json $res/q_new.json > $res/q_new.txt 2>&1; echo "new:  $(row $res/q_new.txt)"
echo "($(( $(date +%s) - t0 )) s)"; save
timeout 240 $T --test-threads=1 tc::router_k_parts expert_scale::glu tc::block_is_deterministic tc::single_expert decode::batch > $res/tests_a.txt 2>&1; echo "tests a ($(( $(date +%s) - t0 )) s):"; summ $res/tests_a.txt
save; echo "all $(( $(date +%s) - t0 )) s"

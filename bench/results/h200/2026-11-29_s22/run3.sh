#!/usr/bin/env bash
# Twenty-second session, third call: the router's K in parts (tc_gemm
# TcRows::Parts + tc_sum_parts) — base (PDL everywhere, the lookahead knob,
# per-expert scales: moekit.base) vs new, alternated; the GPU tests of the
# per-expert scales, the router parts and the paths PDL touches;
# compute-sanitizer on the new kernels; Mixtral/deepseek MOEKIT_TC_LOOK 0 vs 2.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; B=/tmp/bin/moekit.base; T=/tmp/bin/moekit-gpu-tests; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
b() { local bin=$1 look=$2; shift 2; MOEKIT_TC_LOOK=$look timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) | ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,bf16 --tokens 64,512,4096"
for r in 1 2; do
  b $B 0 $Q --json $res/q_base_r$r.json > $res/q_base_r$r.txt 2>&1; echo "base r$r: $(row $res/q_base_r$r.txt)"
  b $N 0 $Q --json $res/q_new_r$r.json > $res/q_new_r$r.txt 2>&1; echo "new  r$r: $(row $res/q_new_r$r.txt)"
  echo "($(( $(date +%s) - t0 )) s)"; save
done
for p in mixtral-8x7b gpt-oss-20b; do
  b $B 0 --preset $p --format affine4 --tokens 64,512 > $res/${p}_base.txt 2>&1
  b $N 0 --preset $p --format affine4 --tokens 64,512 --json $res/${p}_new.json > $res/${p}_new.txt 2>&1
  echo "$p base: $(row $res/${p}_base.txt) new: $(row $res/${p}_new.txt)"
done
save
timeout 200 $T --test-threads=1 tc::router_k_parts expert_scale:: moe::every_fixture moe::family_blocks moe::moe_block_captures tc::block_is_deterministic tc::single_expert > $res/tests_a.txt 2>&1; echo "tests a ($(( $(date +%s) - t0 )) s):"; summ $res/tests_a.txt; save
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 $T --test-threads=1 expert_scale::combine_weights tc::router_k_parts > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
save
for r in 1 2; do for look in 0 2; do
  b $N $look --preset mixtral-8x7b --format affine4,q4_k --tokens 64,512 > $res/mixtral_look${look}_r$r.txt 2>&1; echo "mixtral look $look r$r: $(row $res/mixtral_look${look}_r$r.txt)"
done; done
save; echo "all $(( $(date +%s) - t0 )) s"

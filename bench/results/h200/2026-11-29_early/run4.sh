#!/usr/bin/env bash
# Twentieth session, fourth call (final tree): tc_ra's narrow wgmma N and
# unpermute's slot loads issued together — base (9acbadc, moekit.base) vs
# final alternated over every preset; GPU tests and compute-sanitizer of
# what changed.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/kc_new /tmp/kc_base
tar xJf gpu-bundle/kc_new.tar.xz -C /tmp/kc_new; tar xJf gpu-bundle/kc_base.tar.xz -C /tmp/kc_base
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=gpu-bundle/moekit; B=gpu-bundle/moekit.base
save() { tar czf "$out/res.tgz" -C $res .; }
b() { local kc=$1 bin=$2; shift 2; MOEKIT_CACHE_DIR=$kc timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,bf16 --tokens 16,64,512,4096"
for r in 1 2; do
  b /tmp/kc_base $B $Q --json $res/q_base_r$r.json > $res/q_base_r$r.txt 2>&1; echo "base r$r: $(row $res/q_base_r$r.txt)"
  b /tmp/kc_new $N $Q --json $res/q_new_r$r.json > $res/q_new_r$r.txt 2>&1; echo "new  r$r: $(row $res/q_new_r$r.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"; save
for p in mixtral-8x7b deepseek-v2-lite gpt-oss-20b qwen3-next-80b; do
  b /tmp/kc_base $B --preset $p --format affine4 --tokens 64,512,4096 > $res/${p}_base.txt 2>&1
  b /tmp/kc_new $N --preset $p --format affine4 --tokens 64,512,4096 --json $res/${p}_new.json > $res/${p}_new.txt 2>&1
  echo "$p base: $(row $res/${p}_base.txt) new: $(row $res/${p}_new.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"; save
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
export MOEKIT_CACHE_DIR=/tmp/kc_new
timeout 150 $T --test-threads=1 permute:: route_sort::sort tc_ra::every_tile tc_ra::batch_invariant tc_ra::sanitizer_sweep tc_ra::permute > $res/tests_a.txt 2>&1; echo "tests a ($(( $(date +%s) - t0 )) s):"; summ $res/tests_a.txt; save
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 $T --test-threads=1 permute:: tc_ra::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
save
timeout 170 $T --test-threads=1 tc::block_is_deterministic tc::single_expert moe::family_blocks moe::moe_block_captures moe::every_fixture > $res/tests_b.txt 2>&1; echo "tests b ($(( $(date +%s) - t0 )) s):"; summ $res/tests_b.txt
save
echo "all $(( $(date +%s) - t0 )) s"

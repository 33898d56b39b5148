#!/usr/bin/env bash
# Twenty-first session, first call: tc_ra's span_slice (weight pointers
# advanced by whole spans, no per-span validity selects) — base (09c2eb4,
# moekit.base) vs new alternated; then the GPU tests of tc_ra / tc / moe and
# compute-sanitizer of tc_ra.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
# The bundle travels compressed (gpu-bundle/xz: binaries, the base CLI, the
# kernel caches: kc_new holds only what differs from kc_base).
X=gpu-bundle/xz
for f in moekit moekit.base moekit-gpu-tests; do xz -dc $X/$f.xz > gpu-bundle/$f; chmod +x gpu-bundle/$f; done
mkdir -p /tmp/kc_new /tmp/kc_base
tar xJf $X/kc_base.tar.xz -C /tmp/kc_base; tar xJf $X/kc_base.tar.xz -C /tmp/kc_new; tar xJf $X/kc_new.tar.xz -C /tmp/kc_new
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=gpu-bundle/moekit; B=gpu-bundle/moekit.base
save() { tar czf "$out/res.tgz" -C $res .; }
b() { local kc=$1 bin=$2; shift 2; MOEKIT_CACHE_DIR=$kc timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q4_0,affine8 --tokens 64,512,4096"
for r in 1 2; do
  b /tmp/kc_base $B $Q --json $res/q_base_r$r.json > $res/q_base_r$r.txt 2>&1; echo "base r$r: $(row $res/q_base_r$r.txt)"
  b /tmp/kc_new $N $Q --json $res/q_new_r$r.json > $res/q_new_r$r.txt 2>&1; echo "new  r$r: $(row $res/q_new_r$r.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"; save
for p in mixtral-8x7b deepseek-v2-lite; do
  b /tmp/kc_base $B --preset $p --format affine4 --tokens 64,512 > $res/${p}_base.txt 2>&1
  b /tmp/kc_new $N --preset $p --format affine4 --tokens 64,512 --json $res/${p}_new.json > $res/${p}_new.txt 2>&1
  echo "$p base: $(row $res/${p}_base.txt) new: $(row $res/${p}_new.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"; save
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
export MOEKIT_CACHE_DIR=/tmp/kc_new
timeout 200 $T --test-threads=1 tc_ra:: > $res/tests_ra.txt 2>&1; echo "tests tc_ra ($(( $(date +%s) - t0 )) s):"; summ $res/tests_ra.txt; save
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 $T --test-threads=1 tc_ra::sanitizer_sweep tc_ra::narrow > $res/san_memcheck.txt 2>&1
echo "memcheck: $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' ' ')"; save
M=$N OUT=$res/ncu CASES="affine4:4096 affine4:64" SOURCE=0 MOEKIT_CACHE_DIR=/tmp/kc_new timeout 150 bash bench/profile/ra_stalls.sh > $res/ncu.txt 2>&1
cat $res/ncu.txt; save
timeout 80 compute-sanitizer --tool racecheck --error-exitcode 3 $T --test-threads=1 tc_ra::sanitizer_sweep > $res/san_racecheck.txt 2>&1
echo "racecheck: $(grep -E "RACECHECK SUMMARY|test result" $res/san_racecheck.txt | tr '\n' ' ')"; save
timeout 150 $T --test-threads=1 tc::block_matches_cpu_for_every_format tc::block_is_deterministic > $res/tests_b.txt 2>&1; echo "tests b ($(( $(date +%s) - t0 )) s):"; summ $res/tests_b.txt
save
echo "all $(( $(date +%s) - t0 )) s"

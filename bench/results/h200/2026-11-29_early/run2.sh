#!/usr/bin/env bash
# Twentieth session, second call: the tensor-core path's small kernels —
# the router on router_mma (K split over a block's warps), unpermute with its
# slot loads issued together, the one-block sort up to 4096 slots — and
# tc_ra's narrow wgmma N, base (9acbadc, moekit.base) vs new alternated;
# per-kernel times; GPU tests of what changed.
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
  b /tmp/kc_base $B --preset $p --format affine4 --tokens 64,512 > $res/${p}_base.txt 2>&1
  b /tmp/kc_new $N --preset $p --format affine4 --tokens 64,512 > $res/${p}_new.txt 2>&1
  echo "$p base: $(row $res/${p}_base.txt) new: $(row $res/${p}_new.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"; save
for t in 64 512; do
  MOEKIT_CACHE_DIR=/tmp/kc_new timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    --kernel-name regex:'route|sort|permute|tc_|act|swiglu|weight_rows|combine|bias|norm|gather|ra_|router' --launch-skip 12 --launch-count 12 --csv --print-units base \
    $N bench --preset qwen3-30b-a3b --format affine4 --tokens $t --device cuda --dtype bf16 --min-time 0 2>/dev/null > $res/kern_$t.csv
  echo "== kernels of one call, T = $t (ncu, clocks free)"; python3 bench/profile/ncu_table.py < $res/kern_$t.csv | cut -c1-110
done
echo "($(( $(date +%s) - t0 )) s)"; save
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
export MOEKIT_CACHE_DIR=/tmp/kc_new
timeout 150 $T --test-threads=1 router_mma:: permute:: route_sort::sort tc_ra::every_tile tc_ra::batch_invariant > $res/tests_a.txt 2>&1; echo "tests a ($(( $(date +%s) - t0 )) s):"; summ $res/tests_a.txt; save
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $T --test-threads=1 router_mma:: permute:: > $res/san_memcheck.txt 2>&1
echo "memcheck: $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' ' ')"
timeout 150 $T --test-threads=1 tc::block_is_deterministic moe::family_blocks > $res/tests_b.txt 2>&1; echo "tests b ($(( $(date +%s) - t0 )) s):"; summ $res/tests_b.txt
save
echo "all $(( $(date +%s) - t0 )) s"

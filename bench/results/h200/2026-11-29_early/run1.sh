#!/usr/bin/env bash
# Twentieth session, first call: (1) decode — the down blocks of one token
# select their expert and issue their first spans' weights before the wait
# (kernels/decode.cu `early`), base (9acbadc, moekit.base) vs new alternated;
# (2) tc_ra — tiles run at the narrowest wgmma N that holds their rows
# (RaWidths), new vs MOEKIT_TC_RA_NARROW=0 vs base; (3) GPU decode:: and
# tc_ra:: tests of the new tree.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/kc_new /tmp/kc_base
tar xJf gpu-bundle/kc_new.tar.xz -C /tmp/kc_new; tar xJf gpu-bundle/kc_base.tar.xz -C /tmp/kc_base
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=gpu-bundle/moekit; B=gpu-bundle/moekit.base
b() { local kc=$1 bin=$2; shift 2; MOEKIT_CACHE_DIR=$kc timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q4_0,q8_0,bf16 --tokens 1,2,4,8 --path decode"
save() { tar czf "$out/res.tgz" -C $res .; }
Q2="--preset qwen3-30b-a3b --format affine4,q4_k,bf16 --tokens 1,8 --path decode"
b /tmp/kc_base $B $Q > $res/dec_base_r1.txt 2>&1; echo "base r1: $(row $res/dec_base_r1.txt)"
b /tmp/kc_new $N $Q > $res/dec_new_r1.txt 2>&1; echo "new  r1: $(row $res/dec_new_r1.txt)"
b /tmp/kc_base $B $Q2 > $res/dec_base_r2.txt 2>&1; echo "base r2: $(row $res/dec_base_r2.txt)"
b /tmp/kc_new $N $Q2 > $res/dec_new_r2.txt 2>&1; echo "new  r2: $(row $res/dec_new_r2.txt)"
save
echo "($(( $(date +%s) - t0 )) s)"
for p in mixtral-8x7b deepseek-v2-lite gpt-oss-20b; do
  b /tmp/kc_base $B --preset $p --format affine4 --tokens 1 --path decode > $res/${p}_base.txt 2>&1
  b /tmp/kc_new $N --preset $p --format affine4 --tokens 1 --path decode > $res/${p}_new.txt 2>&1
  echo "$p base: $(row $res/${p}_base.txt) new: $(row $res/${p}_new.txt)"
done
MOEKIT_TRACE=1 b /tmp/kc_new $N --preset qwen3-30b-a3b --format affine4 --tokens 1 --path decode > $res/trace_new.txt 2>&1
MOEKIT_TRACE=1 b /tmp/kc_base $B --preset qwen3-30b-a3b --format affine4 --tokens 1 --path decode > $res/trace_base.txt 2>&1
echo "($(( $(date +%s) - t0 )) s)"
TQ="--preset qwen3-30b-a3b --format affine4,q4_k --tokens 64,512,4096"
b /tmp/kc_base $B $TQ > $res/tc_base.txt 2>&1; echo "tc base: $(row $res/tc_base.txt)"
b /tmp/kc_new $N $TQ > $res/tc_new.txt 2>&1; echo "tc new: $(row $res/tc_new.txt)"
MOEKIT_TC_RA_NARROW=0 b /tmp/kc_new $N $TQ > $res/tc_new_full.txt 2>&1; echo "tc new N=BM: $(row $res/tc_new_full.txt)"
save
for p in deepseek-v2-lite; do
  b /tmp/kc_new $N --preset $p --format affine4 --tokens 512 > $res/tc_${p}_new.txt 2>&1
  MOEKIT_TC_RA_NARROW=0 b /tmp/kc_new $N --preset $p --format affine4 --tokens 512 > $res/tc_${p}_full.txt 2>&1
  echo "$p T=512 new: $(row $res/tc_${p}_new.txt) N=BM: $(row $res/tc_${p}_full.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"
MOEKIT_CACHE_DIR=/tmp/kc_new OUT=$res/ncu M=$N SOURCE=0 CASES="affine4:64 affine4:512" timeout 150 bash bench/profile/ra_stalls.sh > $res/stalls_tc.txt 2>&1
MOEKIT_CACHE_DIR=/tmp/kc_new OUT=$res/ncu M=$N SOURCE=0 KERNEL='decode_.*_mma' PATHSEL=decode CASES="affine4:1 affine4:8" timeout 120 bash bench/profile/ra_stalls.sh > $res/stalls_dec.txt 2>&1
for t in 64 512; do
  MOEKIT_CACHE_DIR=/tmp/kc_new timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
    --kernel-name regex:'route|sort|permute|tc_|act|swiglu|weight_rows|combine|bias|norm|gather|ra_' --launch-skip 12 --launch-count 12 --csv --print-units base \
    $N bench --preset qwen3-30b-a3b --format affine4 --tokens $t --device cuda --dtype bf16 --min-time 0 2>/dev/null > $res/kern_$t.csv
  echo "== kernels of one call, T = $t (ncu, clocks free)"; python3 bench/profile/ncu_table.py < $res/kern_$t.csv | cut -c1-120
done
grep -v "^==PROF" $res/stalls_tc.txt $res/stalls_dec.txt | cut -c1-400
echo "($(( $(date +%s) - t0 )) s)"; save
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
MOEKIT_CACHE_DIR=/tmp/kc_new timeout 200 $T --test-threads=1 decode:: > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt; save
MOEKIT_CACHE_DIR=/tmp/kc_new timeout 120 $T --test-threads=1 tc_ra::every_tile tc_ra::batch_invariant > $res/tests_tcra.txt 2>&1; echo "tc_ra tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_tcra.txt
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

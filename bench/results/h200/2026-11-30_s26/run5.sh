#!/usr/bin/env bash
# Fifth call: the decoding producer through raw stages (cp.async of the packed rows,
# the staged kernel's TcStager copies) instead of register loads a step ahead.
# Tests, sanitizers, then MOEKIT_TC_TMA=all against 0.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p /tmp/kc; tar xJf gpu-bundle/xz/kcache.tar.xz -C /tmp/kc
N=/tmp/bin/moekit
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
t() { timeout "$1" /tmp/bin/gt --test-threads=1 --nocapture "${@:2}" > $res/$2.txt 2>&1; echo "$2 rc=$? $(grep -E "test result|panicked" $res/$2.txt | head -6 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save; }
t 60 tc_tma::sanitizer_sweep
t 90 tc_tma::quantized
t 60 tc_tma::matches
t 90 expert_scale::glu_epilogues
grep -q "test result: ok" $res/tc_tma::quantized.txt || { grep -E "panicked|NMSE|differs|check:" $res/tc_tma::quantized.txt | tail -8; echo stop; exit 0; }
timeout 100 compute-sanitizer --tool racecheck --error-exitcode 3 /tmp/bin/gt --test-threads=1 tc_tma::sanitizer_sweep > $res/san_racecheck.txt 2>&1; echo "racecheck rc=$? $(grep -E "RACECHECK SUMMARY|test result" $res/san_racecheck.txt | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 /tmp/bin/gt --test-threads=1 tc_tma::sanitizer_sweep > $res/san_memcheck.txt 2>&1; echo "memcheck rc=$? $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
b() { # name mode preset format tokens
  MOEKIT_TC_TMA=$2 timeout 60 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset $3 --format $4 --tokens $5 > $res/b_$1_$2.txt 2>&1
  echo "tma=$2 $3: $(row $res/b_$1_$2.txt) ($(( $(date +%s) - t0 )) s)"; save
}
for mode in all 0; do
  b q3 $mode qwen3-30b-a3b affine4-g64,q4_k,q8_0,q4_0,q6_k 4096
  b q3m $mode qwen3-30b-a3b affine4-g64,q4_k,q8_0 512
  b ds $mode deepseek-v2-lite affine4-g64 4096
  b mx $mode mixtral-8x7b affine4-g64 4096
done
echo "all $(( $(date +%s) - t0 )) s"

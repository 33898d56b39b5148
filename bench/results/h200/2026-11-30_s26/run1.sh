#!/usr/bin/env bash
# First call: tc_tma with decoded (quantized) weights and the GLU epilogue.
# Tests (tc_tma::, expert_scale's GLU epilogues), then A/B of MOEKIT_TC_TMA
# 0 (tc_ra / staged as before) against the default and `all`.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
t() { timeout "$1" /tmp/bin/gt --test-threads=1 "${@:2}" > $res/$2.txt 2>&1; echo "$2 rc=$? $(grep -E "test result|panicked" $res/$2.txt | head -6 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save; }
t 150 tc_tma::
grep -q "test result: ok" $res/tc_tma::.txt || { grep -E "panicked|NMSE|differs" -A3 $res/tc_tma::.txt | head -30; echo stop; exit 0; }
t 90 expert_scale::glu_epilogues
b() { # name mode preset format tokens
  MOEKIT_TC_TMA=$2 timeout 60 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset $3 --format $4 --tokens $5 > $res/b_$1_$2.txt 2>&1
  echo "tma=$2 $3: $(row $res/b_$1_$2.txt) ($(( $(date +%s) - t0 )) s)"; save
}
for mode in 0 1; do
  b q3 $mode qwen3-30b-a3b affine4-g64,q4_k,q8_0,q4_0,q6_k 4096
  b go $mode gpt-oss-20b bf16,affine4-g64 4096
  b ds $mode deepseek-v2-lite affine4-g64 4096
done
b q3s all qwen3-30b-a3b affine4-g64,q4_k,q8_0 512
b q3s 0 qwen3-30b-a3b affine4-g64,q4_k,q8_0 512
b mx 0 mixtral-8x7b affine4-g64,q4_k 4096
b mx 1 mixtral-8x7b affine4-g64,q4_k 4096
echo "all $(( $(date +%s) - t0 )) s"

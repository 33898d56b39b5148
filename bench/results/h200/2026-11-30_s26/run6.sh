#!/usr/bin/env bash
# Sixth call: the final tree. The block tests through the new kernel choice
# (tc_moe::expert_kernels: tc_tma beside tc_ra / the staged kernel) by
# default and with MOEKIT_TC_TMA=all (every block's experts on tc_tma,
# decoded formats included), the tc_tma and tc_ra suites, then the default
# path of each preset at T = 4096 (bf16, affine4) against MOEKIT_TC_TMA=0.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p /tmp/kc; tar xJf gpu-bundle/xz/kcache.tar.xz -C /tmp/kc
N=/tmp/bin/moekit
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
t() { timeout "$1" /tmp/bin/gt --test-threads=1 "${@:2}" > $res/$2$TAG.txt 2>&1; echo "$2$TAG rc=$? $(grep -E "test result|panicked" $res/$2$TAG.txt | head -6 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save; }
TAG=""
t 120 tc_tma::
t 150 tc::block moe:: expert_scale::scaled_blocks
TAG="_all"; export MOEKIT_TC_TMA=all
t 240 tc::block moe:: expert_scale::scaled_blocks
unset MOEKIT_TC_TMA; TAG=""
b() { # name mode preset format tokens
  MOEKIT_TC_TMA=$2 timeout 60 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset $3 --format $4 --tokens $5 > $res/b_$1_$2.txt 2>&1
  echo "tma=$2 $3: $(row $res/b_$1_$2.txt) ($(( $(date +%s) - t0 )) s)"; save
}
for mode in 1 0; do
  b go $mode gpt-oss-20b bf16,affine4-g64 512,4096
  b q3 $mode qwen3-30b-a3b bf16,affine4-g64 4096
done
echo "all $(( $(date +%s) - t0 )) s"

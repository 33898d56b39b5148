#!/usr/bin/env bash
# Seventh call: the block tests run6 left when its time ran out, with
# MOEKIT_TC_TMA=all (every block's experts on tc_tma, decoded formats too).
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; xz -dc gpu-bundle/xz/gt.xz > /tmp/bin/gt; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p /tmp/kc; tar xJf gpu-bundle/xz/kcache.tar.xz -C /tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
export MOEKIT_TC_TMA=all
for f in tc::block_matches_cpu_for_every_format tc::block_is_deterministic moe::synthetic_blocks_ggml moe::synthetic_blocks_mlx_fp; do
  timeout 150 /tmp/bin/gt --test-threads=1 $f > $res/$f.txt 2>&1; echo "$f rc=$? $(grep -E "test result|panicked" $res/$f.txt | head -4 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
  [ $(( $(date +%s) - t0 )) -gt 330 ] && break
done
echo "all $(( $(date +%s) - t0 )) s"

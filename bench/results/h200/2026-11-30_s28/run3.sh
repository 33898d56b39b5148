#!/usr/bin/env bash
# silu's division as __fdividef (common.cuh): the tree before (moekit_a,
# b6660b6) vs after, alternated, two rounds; gpt-oss-20b bf16 with its
# gate/up on tc_tma (MOEKIT_TC_TMA=all) vs the default, same binary; the GPU
# tests the division touches (tc_tma::, tc_ra::, decode::, expert_scale::).
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit moekit_a gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
summ() { grep -E "^test .* FAILED$|test result|panicked at" "$1" | head -12; }
for r in 1 2; do for v in moekit_a moekit; do
  timeout 90 /tmp/bin/$v bench --device cuda --dtype bf16 --min-time 0.05 --preset qwen3-30b-a3b --format bf16,affine4,q4_k --tokens 1,512,4096 > $res/q_${v}_$r.txt 2>&1
  echo "r$r $v qwen3: $(row $res/q_${v}_$r.txt) ($(( $(date +%s) - t0 )) s)"
  timeout 60 /tmp/bin/$v bench --device cuda --dtype bf16 --min-time 0.05 --preset mixtral-8x7b --format bf16 --tokens 4096 > $res/mx_${v}_$r.txt 2>&1
  echo "r$r $v mixtral: $(row $res/mx_${v}_$r.txt) ($(( $(date +%s) - t0 )) s)"
done; save; done
for r in 1 2; do for m in 1 all; do
  MOEKIT_TC_TMA=$m timeout 60 /tmp/bin/moekit bench --device cuda --dtype bf16 --min-time 0.05 --preset gpt-oss-20b --format bf16 --tokens 4096 > $res/go_${m}_$r.txt 2>&1
  echo "r$r TC_TMA=$m gpt-oss: $(row $res/go_${m}_$r.txt)"
done; done; save
for t in tc_tma:: "tc_ra::every_tile_size tc_ra::batch" "decode::decode_and_general decode::decode_is_det" expert_scale::; do
  n=$(echo $t | tr -dc 'a-z_' | cut -c1-20)
  timeout 150 /tmp/bin/gt --test-threads=1 $t > $res/tests_$n.txt 2>&1; echo "tests $t rc=$? ($(( $(date +%s) - t0 )) s)"; summ $res/tests_$n.txt; save
  [ $(( $(date +%s) - t0 )) -gt 380 ] && break
done
echo "all $(( $(date +%s) - t0 )) s"

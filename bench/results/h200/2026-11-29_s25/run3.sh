#!/usr/bin/env bash
# Third call: tc_tma with x rows on wgmma M and weights on N (paired stores).
# Tests, sanitizers, A/B against the staged kernel
# (MOEKIT_TC_TMA=0), and ncu of the tc_tma kernels at qwen3 T = 4096.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
timeout 150 /tmp/bin/gt --test-threads=1 tc_tma:: > $res/tests.txt 2>&1; echo "tests rc=$? $(grep -E "test result|panicked|FAILED|failed" $res/tests.txt | head -8 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
if grep -q "test result: ok" $res/tests.txt; then
  for tool in memcheck racecheck; do
    timeout 120 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/bin/gt --test-threads=1 tc_tma::sanitizer_sweep > $res/san_$tool.txt 2>&1
    echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
  done
  for r in 1 2; do
    for mode in 0 1; do
      for pre in qwen3-30b-a3b mixtral-8x7b deepseek-v2-lite gpt-oss-20b qwen3-next-80b; do
        MOEKIT_TC_TMA=$mode timeout 60 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset $pre --format bf16 --tokens 512,4096 > $res/b_${pre}_${mode}_$r.txt 2>&1
        echo "r$r tma=$mode $pre: $(row $res/b_${pre}_${mode}_$r.txt) ($(( $(date +%s) - t0 )) s)"; save
      done
    done
  done
  MOEKIT_TC_TMA=all timeout 60 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset qwen3-30b-a3b --format bf16 --tokens 64,512 > $res/b_all.txt 2>&1
  echo "tma=all qwen3: $(row $res/b_all.txt)"; save
  OUT=$res/ncu M=$N KERNEL=tc_tma CASES="bf16:4096" timeout 150 bash bench/profile/ra_stalls.sh > $res/ncu.txt 2>&1
  head -30 $res/ncu.txt; save
fi
echo "all $(( $(date +%s) - t0 )) s"

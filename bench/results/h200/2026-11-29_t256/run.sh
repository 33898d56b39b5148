#!/usr/bin/env bash
# tc_ra's 256-row tiles (N = 256 / 128 / 32 by the tile's rows) against the
# 128-row ones: GPU tests, compute-sanitizer, a same-call A/B (qwen3 T = 4096
# alternating twice; presets whose experts average over 256 rows: the staged
# kernel's 256-row tiles against tc_ra's with MOEKIT_TC_RA=all).
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 200 $T --test-threads=1 tc_ra:: tc::block > $res/tests.txt 2>&1; echo "tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests.txt
M=./gpu-bundle/moekit
b() { timeout 100 $M bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
for r in 1 2; do for cap in 128 256; do
  MOEKIT_TC_RA_TILE=$cap b --preset qwen3-30b-a3b --format affine4,q4_k,affine8,iq4_xs --tokens 4096 --json $res/q_cap${cap}_r$r.json > $res/q_cap${cap}_r$r.txt 2>&1
done; done
for p in mixtral-8x7b deepseek-v2-lite gpt-oss-20b; do for mode in table all; do
  MOEKIT_TC_RA=$mode b --preset $p --format affine4,q4_k --tokens 4096 --json $res/${p}_$mode.json > $res/${p}_$mode.txt 2>&1
done; done
echo "bench ($(( $(date +%s) - t0 )) s):"
for f in $res/q_cap*.txt $res/*_table.txt $res/*_all.txt; do echo "$(basename $f .txt): $(grep -E "^[a-z0-9_-]+ +[0-9]+ " "$f" | awk '{printf "%s/%s %s (%s) ", $1, $2, $9, $12}')"; grep -E "error|Error" "$f" | head -2; done
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool $T --test-threads=1 tc_ra::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

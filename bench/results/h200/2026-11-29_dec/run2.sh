#!/usr/bin/env bash
# Decode A/B (issue 10): base (d81f049) vs the select-only fold routing +
# 8-token router groups, with the gate/up blocks' L2 prefetch knob
# (MOEKIT_DECODE_L2_PF: bits 0-1 down rows none/bulk/line, bit 2 own rows).
# Then GPU decode:: tests and compute-sanitizer on the new kernels.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
b() { local bin=$1; shift; timeout 120 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s ", $1, $2, $9*1000, $13*1000}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q8_0,bf16 --tokens 1,2,4,8 --path decode"
for r in 1 2; do
  b gpu-bundle/moekit.base $Q > $res/base_r$r.txt 2>&1; echo "base r$r: $(row $res/base_r$r.txt)"
  for pf in 0 1 2 5 4; do
    MOEKIT_DECODE_L2_PF=$pf b gpu-bundle/moekit $Q > $res/pf${pf}_r$r.txt 2>&1; echo "pf$pf r$r: $(row $res/pf${pf}_r$r.txt)"
  done
  MOEKIT_DECODE_FOLD=0 b gpu-bundle/moekit $Q --tokens 1 > $res/nofold_r$r.txt 2>&1; echo "nofold r$r: $(row $res/nofold_r$r.txt)"
  echo "($(( $(date +%s) - t0 )) s)"
done
for p in mixtral-8x7b deepseek-v2-lite gpt-oss-20b; do
  b gpu-bundle/moekit.base --preset $p --format affine4,q4_k --tokens 1,8 --path decode > $res/${p}_base.txt 2>&1; echo "$p base: $(row $res/${p}_base.txt)"
  for pf in 0 1 5; do MOEKIT_DECODE_L2_PF=$pf b gpu-bundle/moekit --preset $p --format affine4,q4_k --tokens 1,8 --path decode > $res/${p}_pf$pf.txt 2>&1; echo "$p pf$pf: $(row $res/${p}_pf$pf.txt)"; done
done
echo "($(( $(date +%s) - t0 )) s)"
for pf in 1 5; do for t in 1 8; do
  MOEKIT_TRACE=1 MOEKIT_DECODE_L2_PF=$pf b gpu-bundle/moekit --preset qwen3-30b-a3b --format affine4 --tokens $t --path decode > $res/trace_pf${pf}_$t.txt 2>&1
  echo "== trace pf$pf T=$t"; sed -n '/decode trace/,/down combined/p' $res/trace_pf${pf}_$t.txt | head -19 | grep -v "none$"
done; done
echo "($(( $(date +%s) - t0 )) s)"
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 200 $T --test-threads=1 decode:: > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt
for tool in memcheck racecheck; do
  MOEKIT_DECODE_L2_PF=5 timeout 120 compute-sanitizer --tool $tool $T --test-threads=1 decode::gate_up_blocks_route decode::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

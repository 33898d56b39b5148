#!/usr/bin/env bash
# decode_down_mma reads the folded routing as soon as the publishing block
# wrote it (DecodeParams::routed), asks L2 for its rows, then waits for the
# gate/up grid: MOEKIT_DECODE_EARLY=0 (before) vs 1, same binary,
# alternated; traces; GPU tests of the fold and the decode path; sanitizer.
set -u
res=/tmp/res7; rm -rf $res; mkdir -p $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc7; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
xz -dc gpu-bundle/xz/moekit.xz > /tmp/moekit; xz -dc gpu-bundle/xz/gt.xz > /tmp/gt; chmod +x /tmp/moekit /tmp/gt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
b() { timeout 150 /tmp/moekit bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s %s %s/%s (%s) ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q4_0,q8_0,q6_k,iq4_xs,mxfp4,affine8 --tokens 1 --path decode"
for r in 1 2 3; do for f in 0 1; do
  MOEKIT_DECODE_EARLY=$f b $Q --json $res/q_e${f}_r$r.json > $res/q_e${f}_r$r.txt 2>&1; echo "early=$f r$r: $(row $res/q_e${f}_r$r.txt)"
done; done
for f in 0 1; do
  MOEKIT_DECODE_EARLY=$f b --preset qwen3-30b-a3b --format affine4,q4_k --tokens 2 --path decode > $res/t2_e$f.txt 2>&1; echo "T=2 early=$f: $(row $res/t2_e$f.txt)"
done
echo "($(( $(date +%s) - t0 )) s)"
for f in 0 1; do
  MOEKIT_TRACE=1 MOEKIT_DECODE_EARLY=$f b --preset qwen3-30b-a3b --format affine4,q4_k --tokens 1 --path decode > $res/trace_e$f.txt 2>&1
  sed -n '/affine4-g64 T=1 single replay/,/^$/p' $res/trace_e$f.txt | grep -E "gate/up (products|end)|down|tail end"
done
echo "($(( $(date +%s) - t0 )) s)"
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite" "$1" | head -20; }
timeout 200 /tmp/gt --test-threads=1 decode::gate_up_blocks decode::decode_is_det decode::long_k > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool /tmp/gt --test-threads=1 decode::gate_up_blocks > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
tar czf ${OUT:-/tmp/out}/res.tgz -C $res .
echo "all $(( $(date +%s) - t0 )) s"

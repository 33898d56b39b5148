#!/usr/bin/env bash
# decode_fused_mma, fourth version (tickets of 32 tiles a round trip, one combine pass; only the one-token products compiled: no spills; act rows, scales and biases in shared
# memory too; put_partials with one base address) against the two launches
# (MOEKIT_DECODE_FUSED=0), same binary, alternated; traces; the GPU tests
# of the fused launch and of the decode path it shares code with;
# compute-sanitizer.
set -u
res=/tmp/res5; rm -rf $res; mkdir -p $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc5; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
xz -dc gpu-bundle/xz/moekit.xz > /tmp/moekit; xz -dc gpu-bundle/xz/gt.xz > /tmp/gt; chmod +x /tmp/moekit /tmp/gt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
b() { timeout 150 /tmp/moekit bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s %s/%s (%s) ", $1, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format affine4,q4_k,q4_0,q8_0,q6_k,iq4_xs,mxfp4,affine8 --tokens 1 --path decode"
for r in 1 2; do for f in 0 1; do
  MOEKIT_DECODE_FUSED=$f b $Q --json $res/q_f${f}_r$r.json > $res/q_f${f}_r$r.txt 2>&1; echo "fused=$f r$r: $(row $res/q_f${f}_r$r.txt)"
done; done
echo "($(( $(date +%s) - t0 )) s)"
for f in 0 1; do
  MOEKIT_TRACE=1 MOEKIT_DECODE_FUSED=$f b --preset qwen3-30b-a3b --format affine4,q4_k --tokens 1 --path decode > $res/trace_f$f.txt 2>&1
done
sed -n '/affine4-g64 T=1 single replay/,/^$/p' $res/trace_f1.txt | grep -E "gate/up|down|tail"
echo "($(( $(date +%s) - t0 )) s)"
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE|differ|not finite|did not|fused" "$1" | head -20; }
timeout 150 /tmp/gt --test-threads=1 decode_fused:: > $res/tests_fused.txt 2>&1; echo "fused tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_fused.txt
timeout 150 /tmp/gt --test-threads=1 decode::gate_up_blocks decode::decode_is_det > $res/tests_decode.txt 2>&1; echo "decode tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests_decode.txt
for tool in memcheck racecheck; do
  timeout 60 compute-sanitizer --tool $tool /tmp/gt --test-threads=1 decode_fused::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' ' ')"
done
tar czf ${OUT:-/tmp/out}/res.tgz -C $res .
echo "all $(( $(date +%s) - t0 )) s"

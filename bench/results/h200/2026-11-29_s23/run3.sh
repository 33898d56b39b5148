#!/usr/bin/env bash
# Third call: the generic decoder's next load waits for its span's wgmma
# groups (they read its registers; run1/run2's NaN), the GPU tests of what
# changed (tc_ra, the tile decoders, the decode path that shares MLX 4-bit's
# decoder), compute-sanitizer on tc_ra's sweep, then base vs new again.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
N=/tmp/bin/moekit; B=/tmp/bin/moekit.base; T=/tmp/bin/moekit-gpu-tests; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|differ|not finite|ERROR SUMMARY|RACECHECK SUMMARY" "$1" | tail -12; }
b() { local bin=$1; shift; timeout 150 $bin bench --device cuda --dtype bf16 --min-time 0.05 "$@"; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) | ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
timeout 150 $T --test-threads=4 tc_ra:: > $res/tests_ra.txt 2>&1; echo "tc_ra ($(( $(date +%s) - t0 )) s):"; summ $res/tests_ra.txt
timeout 150 $T --test-threads=4 tc::tile_decoders decode:: > $res/tests_dec.txt 2>&1; echo "decoders, decode ($(( $(date +%s) - t0 )) s):"; summ $res/tests_dec.txt
save
Q="--preset qwen3-30b-a3b --format affine4,q4_k --tokens 64,512,4096"
for r in 1 2; do
  b $B $Q > $res/q_base_r$r.txt 2>&1; echo "base r$r: $(row $res/q_base_r$r.txt)"
  b $N $Q --json $res/q_new_r$r.json > $res/q_new_r$r.txt 2>&1; echo "new  r$r: $(row $res/q_new_r$r.txt)"
  save
done
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool $T --test-threads=1 tc_ra::sanitizer_sweep > $res/san_$tool.txt 2>&1
  echo "$tool ($(( $(date +%s) - t0 )) s): $(summ $res/san_$tool.txt | tr '\n' ' ')"
done
save; echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# The tile order's GPU tests (tc_tma::, tc_ra::, tc::) and compute-sanitizer;
# gpt-oss-20b bf16 T = 4096 with its gate/up on tc_tma (MOEKIT_TC_TMA=all)
# vs the staged kernel in the new order; ncu SASS counters of tc_ra's
# gate/up at qwen3 affine4 T = 512 (where its instructions go).
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in moekit gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
N=/tmp/bin/moekit; export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s (%s) | ", $1, $2, $9*1000, $12}'; echo; }
summ() { grep -E "^test .* FAILED$|test result|panicked at" "$1" | head -12; }
timeout 280 /tmp/bin/gt --test-threads=1 tc_tma:: tc_ra:: tc:: > $res/tests.txt 2>&1; echo "tests rc=$? ($(( $(date +%s) - t0 )) s)"; summ $res/tests.txt; save
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 /tmp/bin/gt --test-threads=1 tc_tma::tile_orders > $res/san_$tool.txt 2>&1
  echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result" $res/san_$tool.txt | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
done
for r in 1 2; do for m in 0 all; do
  MOEKIT_TC_TMA=$m timeout 60 $N bench --device cuda --dtype bf16 --min-time 0.05 --preset gpt-oss-20b --format bf16 --tokens 512,4096 > $res/go_${m}_$r.txt 2>&1
  echo "r$r TC_TMA=$m gpt-oss: $(row $res/go_${m}_$r.txt)"
done; done; save
for k in "tc_ra.*, 2, 64" "tc_ra.*, 1, 64"; do
  n=$(echo "$k" | tr -dc '0-9'); 
  timeout 120 ncu --section WarpStateStats --section SourceCounters --import-source no --kernel-name regex:"$k" --launch-skip 2 --launch-count 1 \
    -o $res/ra_$n -f $N bench --preset qwen3-30b-a3b --format affine4 --tokens 512 --device cuda --dtype bf16 --min-time 0 --path tc > /dev/null 2>&1
  ncu -i $res/ra_$n.ncu-rep --page source --print-source sass --csv > $res/sass_ra_$n.csv 2>&1
  echo "== $k ($(( $(date +%s) - t0 )) s)"; python3 bench/profile/ncu_hot.py < $res/sass_ra_$n.csv | head -14
  rm -f $res/ra_$n.ncu-rep; gzip -9 $res/sass_ra_$n.csv; save
done
echo "all $(( $(date +%s) - t0 )) s"

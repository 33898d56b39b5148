#!/usr/bin/env bash
# Twenty-first session, fourth call: NVFP4 on tc_ra (max tile 64, as MXFP4)
# — bench with tc_ra off (MOEKIT_TC_RA=0: staged), the table, and every tile
# (all), alternated; tc_ra's every-format tests (NVFP4 now among them) and
# memcheck of the narrow-tile one.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
X=gpu-bundle/xz
for f in moekit moekit-gpu-tests; do xz -dc $X/$f.xz > gpu-bundle/$f; chmod +x gpu-bundle/$f; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
export MOEKIT_CACHE_DIR=/tmp/kc_run4
save() { tar czf "$out/res.tgz" -C $res .; }
row() { grep -E "^[a-z0-9_-]+ +[0-9]+ " "$1" | awk '{printf "%s/%s %s/%s (%s) ", $1, $2, $9*1000, $13*1000, $12}'; echo; }
Q="--preset qwen3-30b-a3b --format nvfp4 --tokens 16,64,512,4096"
for r in 1 2; do
  for m in 0 table all; do
    MOEKIT_TC_RA=$m timeout 120 gpu-bundle/moekit bench --device cuda --dtype bf16 --min-time 0.05 $Q --json $res/b_${m}_r$r.json > $res/b_${m}_r$r.txt 2>&1
    echo "ra=$m r$r: $(row $res/b_${m}_r$r.txt)"
  done
done
echo "($(( $(date +%s) - t0 )) s)"; save
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* (ok|FAILED)$|test result|panicked at|NMSE|differ|not finite" "$1" | head -20; }
timeout 330 $T --test-threads=1 tc_ra::every_format tc_ra::narrow nvfp4 > $res/tests.txt 2>&1; echo "tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests.txt; save
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 $T --test-threads=1 tc::nvfp4 > $res/san_memcheck.txt 2>&1
echo "memcheck: $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' ' ')"; save
echo "all $(( $(date +%s) - t0 )) s"

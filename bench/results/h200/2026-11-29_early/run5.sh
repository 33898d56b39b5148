#!/usr/bin/env bash
# Twentieth session, fifth call: tc_ra::narrow_tiles_every_format (64- and
# 128-row tiles of fewer rows at their narrower wgmma N, every format tc_ra
# runs there) and the rest of tc_ra::, under memcheck too.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc_new
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kc_new.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test |test result|panicked at|NMSE|differ|not finite" "$1" | head -20; }
timeout 300 $T --test-threads=1 tc_ra:: > $res/tests_tcra.txt 2>&1; echo "tc_ra:: ($(( $(date +%s) - t0 )) s):"; summ $res/tests_tcra.txt
tar czf "$out/res.tgz" -C $res .
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 3 $T --test-threads=1 tc_ra::narrow_tiles > $res/san_memcheck.txt 2>&1
echo "memcheck: $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' ' ')"
tar czf "$out/res.tgz" -C $res .
echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Twenty-first session, third call: NVFP4's table decoder on the decode and
# tensor-core paths (tc_decode_iq.cuh TcDecNvfp4) — the tile decoders'
# reference bits, the NVFP4 tests and memcheck, and the bench beside MXFP4
# and the generic decoder's numbers of run2.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
X=gpu-bundle/xz
for f in moekit moekit-gpu-tests; do xz -dc $X/$f.xz > gpu-bundle/$f; chmod +x gpu-bundle/$f; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
export MOEKIT_CACHE_DIR=/tmp/kc_run3
save() { tar czf "$out/res.tgz" -C $res .; }
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* (ok|FAILED)$|test result|panicked at|NMSE|differ|not finite|bits" "$1" | head -20; }
timeout 200 $T --test-threads=1 nvfp4 tc::tile_decoders > $res/tests.txt 2>&1; echo "tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests.txt; save
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 $T --test-threads=1 nvfp4 > $res/san_memcheck.txt 2>&1
echo "memcheck: $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' ' ')"; save
timeout 150 gpu-bundle/moekit bench --device cuda --dtype bf16 --min-time 0.05 --preset qwen3-30b-a3b --format nvfp4,mxfp4 --tokens 1,16,64,512,4096 --json $res/bench.json > $res/bench.txt 2>&1
grep -E "^[a-z0-9_-]+ +[0-9]+ |read bandwidth" $res/bench.txt; save
echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Twenty-first session, second call: GGUF NVFP4 on the GPU — its GPU tests
# (gather_mm, decode path, tensor-core block against the CPU), memcheck of
# the gather_mm one, and a bench beside MXFP4 (kernels JIT-compiled here:
# the decoder header changed, so no cached kernel matches).
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
X=gpu-bundle/xz
for f in moekit moekit-gpu-tests; do xz -dc $X/$f.xz > gpu-bundle/$f; chmod +x gpu-bundle/$f; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
export MOEKIT_CACHE_DIR=/tmp/kc_run2
save() { tar czf "$out/res.tgz" -C $res .; }
T=./gpu-bundle/moekit-gpu-tests
summ() { grep -E "^test .* (ok|FAILED)$|test result|panicked at|NMSE|differ|not finite" "$1" | head -20; }
timeout 300 $T --test-threads=1 nvfp4 > $res/tests_nvfp4.txt 2>&1; echo "tests nvfp4 ($(( $(date +%s) - t0 )) s):"; summ $res/tests_nvfp4.txt; save
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 $T --test-threads=1 gather_mm::ggml_nvfp4 > $res/san_memcheck.txt 2>&1
echo "memcheck: $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' ' ')"; save
timeout 150 gpu-bundle/moekit bench --device cuda --dtype bf16 --min-time 0.05 --preset qwen3-30b-a3b --format nvfp4,mxfp4 --tokens 1,64,4096 --json $res/bench.json > $res/bench.txt 2>&1
grep -E "^[a-z0-9_-]+ +[0-9]+ |read bandwidth" $res/bench.txt; save
echo "all $(( $(date +%s) - t0 )) s"

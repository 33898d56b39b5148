#!/usr/bin/env bash
# Fifth call: the GPU tests of every path that shares the changed decoders
# (MLX 4-bit's lazy scale pairs: decode path, staged tensor-core kernel,
# tc_ra; the cursor: tc_ra), the final tree's test binary.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/moekit-gpu-tests.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
T=/tmp/bin/moekit-gpu-tests; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
summ() { grep -E "^test .* (ok|FAILED)$|test result|panicked at|^  left|^ right|differ|not finite" "$1" | tail -14; }
timeout 480 $T --test-threads=8 decode::decode_matches_cpu_for_every_format tc::block_matches_cpu_for_every_format expert_scale:: moe::every_fixture tc::block_is_deterministic > $res/tests.txt 2>&1
echo "tests ($(( $(date +%s) - t0 )) s):"; summ $res/tests.txt
save; echo "all $(( $(date +%s) - t0 )) s"

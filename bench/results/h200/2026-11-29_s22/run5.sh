#!/usr/bin/env bash
# Twenty-second session, fifth call (final tree): the GPU tests — the
# per-expert scales (expert_scale:: with the fixed tc_ra tile gate and
# sanity bound), the block-level tests over every path and fixture (PDL,
# K parts, scales), the decode path's batch invariance and the general and
# decode paths' agreement.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for f in gpu-bundle/xz/*.xz; do xz -dc "$f" > /tmp/bin/$(basename "$f" .xz); done; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
T=/tmp/bin/moekit-gpu-tests; export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
summ() { grep -E "^test .* FAILED$|test result|panicked at|^  left|^ right|NMSE .*>|differ|not finite|change little" "$1" | head -20; }
timeout 150 $T --test-threads=1 expert_scale:: > $res/tests_a.txt 2>&1; echo "tests a ($(( $(date +%s) - t0 )) s):"; summ $res/tests_a.txt; save
timeout 300 $T --test-threads=1 moe::family_blocks moe::moe_block_captures decode::decode_is_deterministic decode::decode_and_general tc_ra::batch_invariant > $res/tests_b.txt 2>&1; echo "tests b ($(( $(date +%s) - t0 )) s):"; summ $res/tests_b.txt; grep -E "^test " $res/tests_b.txt
save; echo "all $(( $(date +%s) - t0 )) s"

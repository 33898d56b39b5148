#!/usr/bin/env bash
# Sixth call (final tree's tests): tc_tma:: with the bad-offsets test, memcheck
# on it, and the dense block tests with MOEKIT_TC_TMA=all (every dense block
# on tc_tma: CPU agreement, determinism, batch invariance, graph capture).
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; for b in gt; do xz -dc gpu-bundle/xz/$b.xz > /tmp/bin/$b; done; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
timeout 100 /tmp/bin/gt --test-threads=1 tc_tma:: > $res/tests.txt 2>&1; echo "tests rc=$? $(grep -E "test result|panicked|FAILED|failed" $res/tests.txt | head -8 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 /tmp/bin/gt --test-threads=1 tc_tma::bad_offsets > $res/san_memcheck.txt 2>&1
echo "memcheck rc=$? $(grep -E "ERROR SUMMARY|test result" $res/san_memcheck.txt | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
MOEKIT_TC_TMA=all timeout 200 /tmp/bin/gt --test-threads=1 tc::block moe::synthetic_blocks_dense moe::moe_block_captures > $res/tests_all.txt 2>&1
echo "block tests (TMA=all) rc=$? $(grep -E "^test |test result|panicked" $res/tests_all.txt | head -8 | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save
echo "all $(( $(date +%s) - t0 )) s"

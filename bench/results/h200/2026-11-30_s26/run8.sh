#!/usr/bin/env bash
# Eighth call: tc_tma:: on the final kernel source (the producer count
# named, the header reflowed: same code) — the last device minutes.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; xz -dc gpu-bundle/xz/gt.xz > /tmp/bin/gt; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p /tmp/kc; tar xJf gpu-bundle/xz/kcache.tar.xz -C /tmp/kc
timeout 150 /tmp/bin/gt --test-threads=1 tc_tma:: > $res/tc_tma.txt 2>&1; echo "tc_tma:: rc=$? $(grep -E "^test |test result|panicked" $res/tc_tma.txt | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"
tar czf "$out/res.tgz" -C $res .

#!/usr/bin/env bash
# Final tree: the whole GPU test suite (kernels compiled first on all cores).
OUTD=${OUT:-/tmp/out}; out=/tmp/prof; mkdir -p $out $OUTD; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $out/device.txt
gpu-bundle/warm_cache 2>&1 | tail -2
echo "warm done $(( $(date +%s) - t0 )) s"
timeout 420 bash gpu-bundle/run.sh 2>&1 | grep -E "^test |test result|panicked|FAILED|failures" > $out/tests.txt
echo "tests done $(( $(date +%s) - t0 )) s"
grep -vE " ok$" $out/tests.txt | head -30; grep -c " ok$" $out/tests.txt
tar czf $OUTD/prof.tgz -C $out .

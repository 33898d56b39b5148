#!/usr/bin/env bash
# Fourth call: where the decoding producer's time goes — ncu stall reasons
# and SASS samples of tc_tma (one step of loads ahead, as committed) on
# qwen3-30b-a3b T = 4096, MOEKIT_TC_TMA=all, affine4-g64 and q8_0.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; xz -dc gpu-bundle/xz/moekit.xz > /tmp/bin/moekit; chmod +x /tmp/bin/*
export MOEKIT_CACHE_DIR=/tmp/kc; mkdir -p /tmp/kc; tar xJf gpu-bundle/xz/kcache.tar.xz -C /tmp/kc
N=/tmp/bin/moekit
save() { tar czf "$out/res.tgz" -C $res .; }
MOEKIT_TC_TMA=all OUT=$res/ncu M=$N KERNEL=tc_tma CASES="affine4-g64:4096 q8_0:4096" timeout 400 bash bench/profile/ra_stalls.sh > $res/ncu.txt 2>&1
cat $res/ncu.txt | grep -v "^-r"
for f in $res/ncu/sass_*.csv; do echo "== $f"; python3 bench/profile/ncu_hot.py < $f | head -24; done
rm -f $res/ncu/*.ncu-rep
save
echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# Seventh call (last device minutes): the tile scan shared by tc_gemm, tc_ra
# and tc_tma (tc_common.cuh expert_tiles) — tc_tma::, tc::every_tile_size /
# bad_offsets, tc_ra::every_tile_size.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; xz -dc gpu-bundle/xz/gt.xz > /tmp/bin/gt; chmod +x /tmp/bin/gt
export MOEKIT_CACHE_DIR=/tmp/kc
save() { tar czf "$out/res.tgz" -C $res .; }
t() { timeout "$1" /tmp/bin/gt --test-threads=1 "${@:2}" > $res/$2.txt 2>&1; echo "$2 rc=$? $(grep -E "^test |test result|panicked" $res/$2.txt | tr '\n' '|') ($(( $(date +%s) - t0 )) s)"; save; }
t 45 tc_tma::
t 50 tc::bad_offsets tc::every_tile_size
t 45 tc_ra::every_tile_size
echo "all $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# compare.sh (ggml vs this commit's moekit), then the same moekit bench with
# the base binary (main at 09c2eb4) right after, each phase when quiet.
#   compare_both.sh OUT NEW_BIN BASE_BIN
set -euo pipefail
OUT="$1"; NEW="$2"; BASE="$3"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../../../.." && pwd)"
mkdir -p "$OUT"
MOEKIT_BIN="$NEW" OUT="$OUT" QUIET_WAIT="${QUIET_WAIT:-600}" GGML_MODES=router \
    TYPES="${TYPES:-q4_0,q4_k,q8_0}" THREADS="${THREADS:-1 2}" MIN_TIME="${MIN_TIME:-0.5}" \
    "$ROOT/bench/peers/ggml_cpu/compare.sh"
for t in ${THREADS:-1 2}; do
    FORMATS="${TYPES:-q4_0,q4_k,q8_0}" TOKENS="${TOKENS:-1,8}" MIN_TIME="${MIN_TIME:-0.5}" QUIET_WAIT="${QUIET_WAIT:-600}" THREADS="$t" python3 "$HERE/rounds.py" "$OUT/base" 1 base="$BASE" \
        2>&1 || true
done

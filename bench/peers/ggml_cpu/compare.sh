#!/usr/bin/env bash
# ggml vs moekit on the CPU, same shapes, same machine, one run.
#
#   bench/peers/ggml_cpu/compare.sh [--build] [GGML_SRC]
#
# Runs build/ggml_moe_bench (ggml's mul_mat_id expert matmuls) and then
# `moekit bench --device cpu` for the same preset / types / T, once per thread
# count (RAYON_NUM_THREADS for moekit, --threads for ggml), and prints a
# side-by-side table. Builds what is missing (ggml via build.sh, moekit via
# cargo); --build rebuilds both.
#
# Env (defaults in brackets):
#   TYPES [q4_0,q4_k,q8_0]  TOKENS [1,8]  THREADS ["1 2"]  MIN_TIME [0.5]
#   PRESET [qwen3-30b-a3b]  REPACK [auto]  GGML_MODES [ids,router]
#   GGML_ARGS [] (extra harness args, e.g. --fused)  OUT [build/compare-<time>]
#   GGML_SRC [/work/.mirror/ggml-org+ggml/repo]  NICE [19] (for the builds only)
#   MOEKIT_BIN [target/release/moekit] (the moekit binary to time)
#   QUIET_WAIT [0]: before each measuring phase, wait up to this many seconds
#     until the CPUs are < QUIET_PCT [10] % busy over one second (other
#     processes); the busy % seen is printed either way.
#   BUSY_PCT [10], RETRIES [3]: a measurement during which other processes
#     took more than BUSY_PCT % of all CPUs is redone, up to RETRIES times:
#     per case inside the ggml harness (--busy-pct), per thread count for
#     moekit (its whole run). The share seen is in the table either way.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
BUILD=0
if [[ "${1:-}" == "--build" ]]; then
    BUILD=1
    shift
fi
GGML_SRC="${1:-${GGML_SRC:-/work/.mirror/ggml-org+ggml/repo}}"
TYPES="${TYPES:-q4_0,q4_k,q8_0}"
TOKENS="${TOKENS:-1,8}"
THREADS="${THREADS:-1 2}"
MIN_TIME="${MIN_TIME:-0.5}"
PRESET="${PRESET:-qwen3-30b-a3b}"
REPACK="${REPACK:-auto}"
GGML_MODES="${GGML_MODES:-ids,router}"
GGML_ARGS="${GGML_ARGS:-}"
NICE="${NICE:-19}"
BUSY_PCT="${BUSY_PCT:-10}"
RETRIES="${RETRIES:-3}"
BUILD_DIR="${BUILD_DIR:-$HERE/build}"
OUT="${OUT:-$BUILD_DIR/compare-$(date +%Y%m%d-%H%M%S)}"
BENCH="$BUILD_DIR/ggml_moe_bench"
MOEKIT="${MOEKIT_BIN:-$ROOT/target/release/moekit}"

if [[ $BUILD == 1 || ! -x "$BENCH" ]]; then
    BUILD_DIR="$BUILD_DIR" NICE="$NICE" "$HERE/build.sh" "$GGML_SRC"
fi
if [[ $BUILD == 1 || ! -x "$MOEKIT" ]]; then
    (cd "$ROOT" && nice -n "$NICE" cargo build --release -j 2 -p moekit-cli)
fi
mkdir -p "$OUT"
QUIET_WAIT="${QUIET_WAIT:-0}"
QUIET_PCT="${QUIET_PCT:-10}"

# Busy % of all CPUs over one second, from /proc/stat.
cpu_busy() {
    local a b
    read -r -a a < <(grep '^cpu ' /proc/stat)
    sleep 1
    read -r -a b < <(grep '^cpu ' /proc/stat)
    local tot=0 idle=0 i
    for i in 1 2 3 4 5 6 7 8; do
        tot=$((tot + b[i] - a[i]))
    done
    idle=$((b[4] - a[4] + b[5] - a[5]))
    echo $(((tot - idle) * 100 / (tot > 0 ? tot : 1)))
}

# Waits (up to QUIET_WAIT s) for a quiet machine; prints what it saw.
wait_quiet() {
    local what="$1" busy waited=0
    busy="$(cpu_busy)"
    while ((busy >= QUIET_PCT && waited < QUIET_WAIT)); do
        sleep 4
        waited=$((waited + 5))
        busy="$(cpu_busy)"
    done
    echo "cpu busy before $what: ${busy}% (waited ${waited}s), load $(cut -d' ' -f1-3 /proc/loadavg)" |
        tee -a "$OUT/env.txt"
}

# moekit knows the legacy and K quants, not the iq types: pass it only those.
MK_TYPES="$(tr ',' '\n' <<<"$TYPES" | tr 'A-Z' 'a-z' |
    grep -E '^(q4_0|q4_1|q5_0|q5_1|q8_0|q[2-6]_k|f32|f16|bf16)$' | paste -sd, - || true)"

{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cpus"
    echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "moekit: $(git -C "$ROOT" rev-parse HEAD) ($(git -C "$ROOT" status --porcelain | wc -l) uncommitted paths)"
    echo "ggml: $(cat "$BUILD_DIR/ggml_commit.txt" 2>/dev/null || echo unknown)"
} | tee "$OUT/env.txt"

# CPU time other processes took while a phase ran: busy jiffies of all CPUs
# (/proc/stat) minus the phase's own user+sys (/usr/bin/time).
busy_jiffies() {
    local a
    read -r -a a < <(grep '^cpu ' /proc/stat)
    echo $((a[1] + a[2] + a[3] + a[6] + a[7] + a[8]))
}
TIMER=()
if [[ -x /usr/bin/time ]]; then
    TIMER=(/usr/bin/time -f "%e %U %S" -o "$OUT/.phase_time")
fi
PHASE_J0=0
phase_start() { PHASE_J0="$(busy_jiffies)"; rm -f "$OUT/.phase_time"; }
phase_end() {
    local what="$1" j1 hz ncpu
    j1="$(busy_jiffies)"
    hz="$(getconf CLK_TCK)"
    ncpu="$(nproc)"
    PHASE_OTHER=0
    if [[ -s "$OUT/.phase_time" ]]; then
        python3 - "$what" "$PHASE_J0" "$j1" "$hz" "$ncpu" "$(tail -n1 "$OUT/.phase_time")" "$OUT/.phase_other" <<'PY' | tee -a "$OUT/env.txt"
import sys
what, j0, j1, hz, ncpu, t, dst = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6], sys.argv[7]
wall, user, sys_ = map(float, t.split())
other = max((j1 - j0) / hz - user - sys_, 0.0)
pct = 100 * other / (wall * ncpu)
print(f"other processes during {what}: {other:.1f} CPU-s over {wall:.1f} s ({pct:.0f}% of {ncpu} cpus)")
open(dst, "w").write(f"{pct:.1f}\n")
PY
        PHASE_OTHER="$(cat "$OUT/.phase_other")"
    fi
}

THREAD_LIST="$(tr ' ' ',' <<<"$THREADS")"
wait_quiet ggml
echo "== ggml: threads $THREAD_LIST"
phase_start
# shellcheck disable=SC2086
"${TIMER[@]}" "$BENCH" --preset "$PRESET" --types "$TYPES" --tokens "$TOKENS" --threads "$THREAD_LIST" \
    --modes "$GGML_MODES" --repack "$REPACK" --min-time "$MIN_TIME" \
    --busy-pct "$BUSY_PCT" --busy-retries "$RETRIES" $GGML_ARGS \
    --json "$OUT/ggml.json" 2> >(grep -v '^repack: repack tensor' >&2) | tee "$OUT/ggml.txt"
phase_end ggml

for t in $THREADS; do
    if [[ -z "$MK_TYPES" ]]; then
        break
    fi
    for ((try = 0; try <= RETRIES; try++)); do
        wait_quiet "moekit t=$t"
        echo "== moekit: RAYON_NUM_THREADS=$t"
        phase_start
        RAYON_NUM_THREADS="$t" "${TIMER[@]}" "$MOEKIT" bench --preset "$PRESET" --format "$MK_TYPES" \
            --tokens "$TOKENS" --device cpu --min-time "$MIN_TIME" --json "$OUT/moekit_t$t.json" 2>&1 |
            grep -v 'expert matrices' | tee "$OUT/moekit_t$t.txt"
        phase_end "moekit t=$t"
        echo "$PHASE_OTHER" >"$OUT/moekit_t$t.other"
        if python3 -c "import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]))" "$PHASE_OTHER" "$BUSY_PCT"; then
            break
        fi
        if ((try < RETRIES)); then
            echo "moekit t=$t: other processes took ${PHASE_OTHER}% of the CPUs; re-measuring in 5 s"
            sleep 5
        fi
    done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/env.txt"

python3 "$HERE/compare_table.py" "$OUT" | tee "$OUT/table.md"
echo "results in $OUT"

#!/usr/bin/env bash
# Detailed ncu sections (speed of light, warp stalls, memory) of the decode
# path's kernels for one case. Usage: bash bench/profile/decode_ncu_detail.sh preset format T
set -uo pipefail
M=${M:-./gpu-bundle/moekit}
export MOEKIT_CACHE_DIR=${MOEKIT_CACHE_DIR:-/tmp/moekit-kernels}
if [ -f gpu-bundle/kcache.tar.xz ] && [ ! -d "$MOEKIT_CACHE_DIR" ]; then
  mkdir -p "$MOEKIT_CACHE_DIR" && tar xJf gpu-bundle/kcache.tar.xz -C "$MOEKIT_CACHE_DIR"
fi
preset=${1:-qwen3-30b-a3b} fmt=${2:-affine4} t=${3:-1}
$M bench --preset "$preset" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 --min-time 0 --path decode >/dev/null 2>&1
ncu --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --metrics \
  smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio \
  --kernel-name regex:'decode_' --launch-skip 3 --launch-count 3 \
  $M bench --preset "$preset" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 --min-time 0 --path decode 2>/dev/null |
  grep -E "decode_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Theoretical Occupancy|stalled|Registers|Waves Per SM|Block Limit" | sed 's/  */ /g'

#!/usr/bin/env bash
# Where tc_ra's warps wait (issue 9): per-kernel stall reasons of the
# tensor-core path's GEMMs, and the SASS-level stall samples of one
# instance (a report $OUT/ra_<case>.ncu-rep plus its source page as CSV).
# Usage (GPU machine, from the repo root, after scripts/gpu-bundle.sh):
#   OUT=/tmp/o CASES="affine4:4096 affine4:512" bash bench/profile/ra_stalls.sh
set -uo pipefail
M=${M:-./gpu-bundle/moekit}
OUTD=${OUT:-/tmp/ra_stalls}; mkdir -p "$OUTD"
export MOEKIT_CACHE_DIR=${MOEKIT_CACHE_DIR:-/tmp/moekit-kernels}
K=${KERNEL:-tc_ra}
PRESET=${PRESET:-qwen3-30b-a3b}
PATHSEL=${PATHSEL:-tc}  # the bench path (decode: the decode kernels, KERNEL=decode_)
ST=""
for s in barrier long_scoreboard short_scoreboard wait math_pipe_throttle lg_throttle mio_throttle membar dispatch_stall no_instruction not_selected selected branch_resolving sleeping drain imc_miss misc tex_throttle; do
  ST="$ST,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
MET="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,lts__t_sectors.sum,dram__bytes_read.sum,launch__grid_size,launch__registers_per_thread$ST"
for c in ${CASES:-affine4:4096 affine4:512}; do
  IFS=: read -r fmt t <<<"$c"
  echo "== $PRESET $fmt T=$t ($K)"
  ncu --metrics "$MET" --kernel-name regex:"$K" --launch-skip 4 --launch-count 2 --csv --print-units base \
    "$M" bench --preset "$PRESET" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 --min-time 0 --path "$PATHSEL" \
    2>/dev/null > "$OUTD/m_${fmt}_$t.csv"
  python3 - "$OUTD/m_${fmt}_$t.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows:
    print("no ncu rows"); sys.exit()
h = rows[0]; ki, mi, vi, ii = (h.index(n) for n in ("Kernel Name", "Metric Name", "Metric Value", "ID"))
d = {}
for r in rows[1:]:
    d.setdefault((int(r[ii]), r[ki].split("(")[0][-62:]), {})[r[mi]] = r[vi].replace(",", "")
for (i, k), m in sorted(d.items()):
    def f(n):
        try:
            return float(m.get(n, 'nan'))
        except ValueError:
            return float('nan')
    st = sorted(((f(n), n.split('stalled_')[1].split('_per')[0]) for n in m if 'stalled' in n), reverse=True)
    print(f"{k} {f('gpu__time_duration.sum')/1e3:.1f}us inst {f('smsp__inst_executed.sum')/1e6:.2f}M "
          f"hmma {f('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):.1f}% "
          f"gmma {f('sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active'):.1f}% "
          f"issue {f('smsp__issue_active.avg.pct_of_peak_sustained_active'):.1f}% "
          f"L2 {f('lts__t_sectors.sum')*32/1e9:.2f}GB dram {f('dram__bytes_read.sum')/1e9:.3f}GB "
          f"grid {m.get('launch__grid_size')} regs {m.get('launch__registers_per_thread')} "
          f"dram% {f('dram__throughput.avg.pct_of_peak_sustained_elapsed'):.1f} occ% {f('sm__warps_active.avg.pct_of_peak_sustained_active'):.1f}")
    print("   stalls/issue: " + " ".join(f"{n}={v:.2f}" for v, n in st if v >= 0.05))
PY
  if [ "${SOURCE:-1}" = 1 ]; then
    ncu --section WarpStateStats --section SourceCounters --import-source no --kernel-name regex:"$K" --launch-skip 4 --launch-count 1 \
      -o "$OUTD/ra_${fmt}_$t" -f "$M" bench --preset "$PRESET" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 \
      --min-time 0 --path tc > /dev/null 2>&1
    ncu -i "$OUTD/ra_${fmt}_$t.ncu-rep" --page source --print-source sass --csv > "$OUTD/sass_${fmt}_$t.csv" 2>&1 || true
    ls -la "$OUTD/sass_${fmt}_$t.csv"
  fi
done

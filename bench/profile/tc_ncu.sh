#!/usr/bin/env bash
# Per-kernel ncu profile of the tensor-core path's GEMMs (issue 9) on a GPU
# machine, from the gpu bundle (scripts/gpu-bundle.sh): duration, issued
# instructions, tensor-pipe and issue-slot activity, grid, registers and the
# main stall reasons of the router, gate/up and down GEMMs of one forward.
# Usage: bash bench/profile/tc_ncu.sh   (CASES="format:T ...", PRESET env)
set -uo pipefail
M=./gpu-bundle/moekit
export MOEKIT_CACHE_DIR=/tmp/moekit-kernels
[ -d $MOEKIT_CACHE_DIR ] || { mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/kcache.tar.xz -C $MOEKIT_CACHE_DIR; }
MET=gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size,launch__registers_per_thread,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio
PRESET=${PRESET:-qwen3-30b-a3b}
for c in ${CASES:-bf16:4096 affine4:4096 affine4:512}; do
  IFS=: read -r fmt t <<<"$c"
  {
    echo "== $PRESET $fmt T=$t"
    # --launch-skip 3: past the first forward (JIT, warm-up).
    ncu --metrics "$MET" --kernel-name regex:'tc_gemm' --launch-skip 3 --launch-count 3 --csv --print-units base \
      $M bench --preset "$PRESET" --format "$fmt" --tokens "$t" --device cuda --dtype bf16 --min-time 0 --path tc 2>/dev/null > /tmp/n.csv
    python3 - <<'PY'
import csv
rows=[r for r in csv.reader(open('/tmp/n.csv')) if len(r)>10]
h=rows[0]; ki,mi,vi,ii=(h.index(n) for n in ("Kernel Name","Metric Name","Metric Value","ID"))
d={}
for r in rows[1:]: d.setdefault((int(r[ii]),r[ki].split("(")[0][-60:]),{})[r[mi]]=r[vi].replace(",","")
for (i,k),m in sorted(d.items()):
    f=lambda n: float(m.get(n,'nan'))
    st=' '.join(f"{n.split('stalled_')[1].split('_per')[0][:6]}={f(n):.2f}" for n in m if 'stalled' in n)
    print(f"{k:60s} {f('gpu__time_duration.sum')/1e3:7.1f}us inst {f('smsp__inst_executed.sum')/1e6:6.2f}M tc {f('sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'):4.1f}% iss {f('smsp__issue_active.avg.pct_of_peak_sustained_active'):4.1f}% grid {m.get('launch__grid_size')} regs {m.get('launch__registers_per_thread')} {st}")
PY
  }
done

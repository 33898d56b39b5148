#!/bin/bash
# One round: the f32 path (before) then the integer kernels (after), 2 threads,
# qwen3-30b-a3b, T = 1 and 8; the machine's load (busy % over 2 s) before and
# after each run. Usage: run_round.sh ROUND [BIN]
set -u
r=$1; bin=${2:-/work/wt-cpu-a/target/release/moekit}
F=iq2_xxs,iq3_s,iq3_xxs,iq2_xs,iq2_s,iq1_m,iq1_s,tq2_0,tq1_0
busy() { read -r _ a b c d e f g h _ < /proc/stat; t1=$((a+b+c+d+e+f+g+h)); i1=$((d+e)); sleep 2
  read -r _ a b c d e f g h _ < /proc/stat; t2=$((a+b+c+d+e+f+g+h)); i2=$((d+e)); echo "busy $(( 100 * ((t2-t1)-(i2-i1)) / (t2-t1) ))% $(date -u +%H:%M:%S)"; }
for mode in before after; do
  out=${mode}_r$r
  act=auto; [ $mode = before ] && act=f32
  { busy; MOEKIT_CPU_ACT=$act RAYON_NUM_THREADS=2 $bin bench --device cpu --preset qwen3-30b-a3b \
      --format $F --tokens 1,8 --min-time 0.4 --json $out.json 2>&1; busy; } > $out.txt
done

#!/bin/bash
# alternate ggml (plain, router mode) and moekit; threads 1 and 2; prints raw lines
R=$1; shift
G=/work/main/bench/peers/ggml_cpu/build/ggml_moe_bench
TYPES=${TYPES:-q4_0,q4_k,q8_0}; TOK=${TOK:-1,8}
for r in $(seq 1 $R); do
  for th in ${THS:-1 2}; do
  $G --types $TYPES --tokens $TOK --threads $th --modes router --repack both --min-time ${MT:-0.3} --no-check 2>/dev/null | awk -v r=$r -v th=$th '$4=="router"{print "ggml-"$5, r, th, tolower($1), $2, $6}'
  for b in "$@"; do
    RAYON_NUM_THREADS=$th $b bench --preset qwen3-30b-a3b --format $TYPES --tokens $TOK --device cpu --min-time ${MT:-0.3} 2>/dev/null | awk -v r=$r -v th=$th -v b=$(basename $b) '$2 ~ /^[0-9]+$/ && NF>5 {print b, r, th, $1, $2, $3}'
  done
  done
done

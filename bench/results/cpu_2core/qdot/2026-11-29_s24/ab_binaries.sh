#!/bin/bash
# alternate moekit binaries; args: rounds, bins...
R=$1; shift
TYPES=${TYPES:-q4_0,q4_k,q8_0}; TOK=${TOK:-1,8}; TH=${TH:-2}
for r in $(seq 1 $R); do
  for b in "$@"; do
    RAYON_NUM_THREADS=$TH $b bench --preset ${PRESET:-qwen3-30b-a3b} --format $TYPES --tokens $TOK --device cpu --min-time ${MT:-0.3} 2>/dev/null | awk -v r=$r -v b=$(basename $b) '$2 ~ /^[0-9]+$/ && NF>5 {print $1, $2, b, r, $3}'
  done
done | sort -k1,1 -k2,2n -k3,3 | awk '{k=$1" "$2" "$3; v[k]=v[k]" "$5} END{for(k in v) print k, v[k]}' | sort -k1,1 -k2,2n -k3,3

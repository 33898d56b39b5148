#!/bin/bash
# ab.sh N FORMAT THREADS: alternate base/new, each when quiet
for i in $(seq $1); do
  for b in base new2; do
    while [ $(/tmp/b/busy.sh) -ge 10 ]; do sleep 2; done
    r=$(RAYON_NUM_THREADS=$3 /tmp/b/moekit_$b bench --device cpu --format $2 --tokens 1,8 --min-time 0.4 2>&1 | grep -E "^$2 " | awk '{printf "T%s %s  ", $2, $3}')
    echo "$(date -u +%H:%M:%S) $b thr=$3 $r"
  done
done

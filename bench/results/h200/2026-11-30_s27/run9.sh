#!/usr/bin/env bash
# Where decode_down_mma and decode_gate_up_mma wait at T = 1 (qwen3 affine4,
# the early routing read on): ncu SASS-level stall samples, the hottest
# instructions of each kernel. (run8's bundle: its T = 1 path is the tree's.)
set -u
res=/tmp/res9; rm -rf $res; mkdir -p $res; t0=$(date +%s)
export MOEKIT_CACHE_DIR=/tmp/kc9; mkdir -p $MOEKIT_CACHE_DIR && tar xJf gpu-bundle/xz/kcache.tar.xz -C $MOEKIT_CACHE_DIR
xz -dc gpu-bundle/xz/moekit.xz > /tmp/moekit; chmod +x /tmp/moekit
for k in decode_down_mma decode_gate_up_mma; do
  ncu --section WarpStateStats --section SourceCounters --import-source no --kernel-name regex:$k --launch-skip 4 --launch-count 1 \
    -o $res/$k -f /tmp/moekit bench --preset qwen3-30b-a3b --format affine4 --tokens 1 --device cuda --dtype bf16 --min-time 0 --path decode > /dev/null 2>&1
  ncu -i $res/$k.ncu-rep --page source --print-source sass --csv > $res/sass_$k.csv 2>&1
  echo "== $k"; python3 bench/profile/ncu_hot.py < $res/sass_$k.csv | head -18 | tee $res/hot_$k.txt
  python3 - $res/sass_$k.csv <<'PY' | tee $res/reasons_$k.txt
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
for i, r in enumerate(rows):
    if any("Sampling" in c for c in r) and any(c == "Source" for c in r):
        hdr, body = r, rows[i + 1:]; break
else:
    print("no table"); sys.exit()
cols = [j for j, c in enumerate(hdr) if c.startswith("stall_") or "Stall" in c]
tot = {}
for r in body:
    for j in cols:
        try: tot[hdr[j]] = tot.get(hdr[j], 0) + float(r[j])
        except (ValueError, IndexError): pass
s = sum(tot.values()) or 1
print("  ".join(f"{k}={100*v/s:.1f}%" for k, v in sorted(tot.items(), key=lambda x: -x[1])[:10]))
PY
  rm -f $res/$k.ncu-rep $res/sass_$k.csv
done
tar czf ${OUT:-/tmp/out}/res.tgz -C $res .
echo "all $(( $(date +%s) - t0 )) s"

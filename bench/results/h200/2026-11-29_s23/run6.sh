#!/usr/bin/env bash
# Sixth call: where qwen3's T = 64 and T = 512 go, kernel by kernel (ncu,
# each kernel alone: no PDL overlap), final tree.
set -u
out=${OUT:-/tmp/out}; res=/tmp/res; mkdir -p "$out" $res; t0=$(date +%s)
mkdir -p /tmp/bin; xz -dc gpu-bundle/xz/moekit.xz > /tmp/bin/moekit; chmod +x /tmp/bin/*
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $res/device.txt
export MOEKIT_CACHE_DIR=/tmp/kc
for t in 64 512; do
  for f in affine4 q4_k; do
    timeout 200 ncu --graph-profiling node --metrics gpu__time_duration.sum --csv --launch-count 600 \
      /tmp/bin/moekit bench --device cuda --dtype bf16 --min-time 0.01 --preset qwen3-30b-a3b --format $f --tokens $t > $res/ncu_${f}_$t.csv 2> $res/ncu_${f}_$t.err
    python3 - $res/ncu_${f}_$t.csv <<'PY'
import csv, sys, statistics, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
d = collections.defaultdict(list)
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    if r[ui] in ("nsecond", "ns"): v /= 1000
    elif r[ui] in ("msecond", "ms"): v *= 1000
    d[r[ki].split("(")[0][:60]].append(v)
tot = 0
for k, v in sorted(d.items(), key=lambda kv: -statistics.median(kv[1]) * len(kv[1])):
    print(f"  {k:60s} n={len(v):4d} median {statistics.median(v):8.1f} us")
PY
    echo "== $f T=$t ($(( $(date +%s) - t0 )) s)"
  done
done
tar czf "$out/res.tgz" -C $res .; echo "all $(( $(date +%s) - t0 )) s"

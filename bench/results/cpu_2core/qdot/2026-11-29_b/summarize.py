#!/usr/bin/env python3
"""Medians over the rounds written by rounds.py: per format, T and thread
count, each binary's median ms and % of the same-run read bandwidth, and
the after ÷ before ratio of the medians.

    summarize.py OUT [BEFORE AFTER]   (names as given to rounds.py)
"""
import glob, json, os, re, statistics, sys

out = sys.argv[1]
names = sys.argv[2:4] or ["base", "new"]
runs = {}
for p in sorted(glob.glob(os.path.join(out, "*_t*_r*.json"))):
    m = re.match(r"(.+)_t(\d+)_r(\d+)\.json", os.path.basename(p))
    name, th = m.group(1), int(m.group(2))
    d = json.load(open(p))
    for c in d["cases"]:
        runs.setdefault((c["format"], c["tokens"], th), {}).setdefault(name, []).append(
            (c["median_ms"], c["pct_of_read_bw"], d["read_bw_gb_per_s"], d.get("other_pct", float("nan"))))
med = statistics.median
bws = {n: [] for n in names}
others = {n: [] for n in names}
for p in sorted(glob.glob(os.path.join(out, "*_t*_r*.json"))):
    n = re.match(r"(.+)_t\d+_r\d+\.json", os.path.basename(p)).group(1)
    if n in bws:
        d = json.load(open(p)); bws[n].append(d["read_bw_gb_per_s"]); others[n].append(d.get("other_pct", float("nan")))
for n in names:
    print(f"{n}: read bandwidth per run (GB/s) " + " ".join(f"{v:.1f}" for v in bws[n])
          + "; other processes during each run (% of the CPUs) " + " ".join(f"{v:.1f}" for v in others[n]))
print()
a, b = names
print(f"| format | T | threads | {a} ms | {b} ms | {b} ÷ {a} | {a} % bw | {b} % bw | rounds |")
print("|---|---|---|---|---|---|---|---|---|")
for (f, t, th), v in sorted(runs.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
    if a not in v or b not in v:
        continue
    ma, mb = med(x[0] for x in v[a]), med(x[0] for x in v[b])
    pa, pb = med(x[1] for x in v[a]), med(x[1] for x in v[b])
    print(f"| {f} | {t} | {th} | {ma:.3f} | {mb:.3f} | {mb / ma:.2f} | {pa:.0f}% | {pb:.0f}% | {len(v[a])}/{len(v[b])} |")

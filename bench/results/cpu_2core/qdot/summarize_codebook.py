#!/usr/bin/env python3
"""Medians of run_codebook.sh's rounds: per format and T, before and after
(ms and % of the read bandwidth measured in the same run), as a Markdown
table.  Usage: summarize_codebook.py OUT_DIR"""
import json, statistics, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {"before": [], "after": []}
for which in runs:
    for p in sorted(out.glob(f"{which}_round*.json")):
        runs[which].append(json.loads(p.read_text()))
keys = []
for c in runs["after"][0]["cases"]:
    keys.append((c["format"], c["tokens"]))
def med(which, key, field):
    v = [c[field] for r in runs[which] for c in r["cases"] if (c["format"], c["tokens"]) == key]
    return statistics.median(v), min(v), max(v)
bw = {w: [r["read_bw_gb_per_s"] for r in runs[w]] for w in runs}
print(f"rounds: {len(runs['before'])} before, {len(runs['after'])} after; "
      f"read bandwidth GB/s before {', '.join(f'{b:.1f}' for b in bw['before'])}; "
      f"after {', '.join(f'{b:.1f}' for b in bw['after'])}; level {runs['after'][0]['cpu_simd_level']}\n")
print("| format | T | before ms (range) | before % bw | after ms (range) | after % bw | speedup |")
print("|---|---|---|---|---|---|---|")
for k in keys:
    b, a = med("before", k, "median_ms"), med("after", k, "median_ms")
    bp, ap = med("before", k, "pct_of_read_bw"), med("after", k, "pct_of_read_bw")
    print(f"| {k[0]} | {k[1]} | {b[0]:.3f} ({b[1]:.2f}–{b[2]:.2f}) | {bp[0]:.1f}% | "
          f"{a[0]:.3f} ({a[1]:.2f}–{a[2]:.2f}) | {ap[0]:.1f}% | {b[0] / a[0]:.2f}× |")

#!/usr/bin/env python3
"""Medians over the rounds of run_prefetch.sh OUT: (1) moekit vs ggml
(compare.sh tables), (2) every format at T = 1, prefetch off vs on, in ms
and as a share of the read bandwidth each run measured.

    summarize_prefetch.py OUT_DIR
"""
import collections
import pathlib
import re
import statistics
import sys

out = pathlib.Path(sys.argv[1])
rounds = sorted(out.glob("round*"))
cmp = collections.defaultdict(list)
for r in rounds:
    for line in (r / "compare" / "table.md").read_text().splitlines():
        c = [x.strip() for x in line.strip("|").split("|")]
        if len(c) > 8 and re.fullmatch(r"q\d_\w+", c[0] or "") and c[1].isdigit():
            cmp[(c[0], int(c[1]), int(c[2]))].append((float(c[5]), float(c[6])))
print(f"## moekit vs ggml (plain weights, with the router), medians of {len(rounds)} rounds\n")
print("| type | T | threads | ggml ms | moekit ms | moekit ÷ ggml (median of ratios) | per round |")
print("|---|---|---|---|---|---|---|")
for k in sorted(cmp):
    v = cmp[k]
    ratios = [m / g for g, m in v]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {statistics.median(g for g, _ in v):.3f} | "
          f"{statistics.median(m for _, m in v):.3f} | {statistics.median(ratios):.2f} | "
          + " ".join(f"{x:.2f}" for x in ratios) + " |")
fmt = collections.defaultdict(list)
bw = collections.defaultdict(list)
for r in rounds:
    for pf in ("0", "4096"):
        p = r / f"pf{pf}_t2.txt"
        for line in p.read_text().splitlines():
            m = re.search(r"read bandwidth ([\d.]+) GB/s", line)
            if m:
                bw[pf].append(float(m.group(1)))
            c = line.split()
            if len(c) > 6 and c[1] == "1" and c[5].endswith("%"):
                fmt[(c[0], pf)].append((float(c[2]), float(c[5].rstrip("%"))))
print(f"\n## qwen3-30b-a3b T = 1, 2 threads, prefetch off (MOEKIT_CPU_PREFETCH=0) vs on (4096), medians of {len(rounds)} rounds\n")
print("read bandwidth measured by the same runs (GB/s): off "
      + " ".join(f"{x:.1f}" for x in bw["0"]) + ", on " + " ".join(f"{x:.1f}" for x in bw["4096"]) + "\n")
print("| format | off ms | on ms | on ÷ off | off % bw | on % bw |")
print("|---|---|---|---|---|---|")
names = []
for (f, _) in fmt:
    if f not in names:
        names.append(f)
for f in names:
    a, b = fmt[(f, "0")], fmt[(f, "4096")]
    am, bm = statistics.median(x for x, _ in a), statistics.median(x for x, _ in b)
    print(f"| {f} | {am:.3f} | {bm:.3f} | {bm / am:.2f} | {statistics.median(p for _, p in a):.0f}% | "
          f"{statistics.median(p for _, p in b):.0f}% |")

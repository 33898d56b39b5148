#!/usr/bin/env python3
"""Medians over the rounds of run_round.sh: f32 path (before_rN.json) and
integer kernels (after_rN.json), ms and % of the same run's read bandwidth,
T = 1 and 8. Usage: summarize.py [ROUND ...] (default: every round with
both files)."""
import glob, json, re, statistics, sys

rounds = sys.argv[1:] or sorted(
    {re.match(r"after_r(.+)\.json", f).group(1) for f in glob.glob("after_r*.json")}
    & {re.match(r"before_r(.+)\.json", f).group(1) for f in glob.glob("before_r*.json")})
data = {}  # (mode, fmt, T) -> [(ms, pct)]
bws = {"before": [], "after": []}
for r in rounds:
    for mode in ("before", "after"):
        d = json.load(open(f"{mode}_r{r}.json"))
        bws[mode].append(d["read_bw_gb_per_s"])
        for c in d["cases"]:
            data.setdefault((mode, c["format"], c["tokens"]), []).append(
                (c["median_ms"], c["pct_of_read_bw"]))
med = lambda v: statistics.median(v)
print(f"rounds {rounds}; same-run read bandwidth GB/s: f32 runs "
      f"{', '.join(f'{b:.1f}' for b in bws['before'])}; integer runs "
      f"{', '.join(f'{b:.1f}' for b in bws['after'])}")
print()
print("| format | T=1 ms f32 → int (×) | T=1 % bw f32 → int | T=8 ms f32 → int (×) | T=8 % bw f32 → int |")
print("|---|---|---|---|---|")
fmts = []
for (m, f, t) in data:
    if f not in fmts:
        fmts.append(f)
for f in fmts:
    cells = []
    for t in (1, 8):
        b, a = data.get(("before", f, t)), data.get(("after", f, t))
        if not b or not a:
            cells += ["-", "-"]
            continue
        bm, am = med([x[0] for x in b]), med([x[0] for x in a])
        bp, ap = med([x[1] for x in b]), med([x[1] for x in a])
        cells.append(f"{bm:.2f} → {am:.2f} ({bm / am:.1f}×)")
        cells.append(f"{bp:.1f}% → {ap:.1f}% (range {min(x[1] for x in a):.1f}–{max(x[1] for x in a):.1f})")
    print(f"| {f} | " + " | ".join(cells) + " |")

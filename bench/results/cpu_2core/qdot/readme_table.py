#!/usr/bin/env python3
"""The README's compact table from run_rounds.sh's rounds (medians):
per format, T = 1 and 8, 1 and 2 threads, f32 → integer-kernel ms, the
default path's % of the same-run read bandwidth at T = 1 (2 threads), and
moekit default / ggml (router mode, same compare.sh run) at 2 threads.

usage: readme_table.py ROUNDS_DIR
"""
import glob
import json
import os
import statistics as st
import sys

root = sys.argv[1]
cell = {}
ggml = {}
for r in sorted(glob.glob(os.path.join(root, "round*"))):
    for what, pat in (("f32", "f32_t{}.json"), ("q8", "q8_t{}.json"),
                      ("default", os.path.join("compare", "moekit_t{}.json"))):
        for t in (1, 2):
            p = os.path.join(r, pat.format(t))
            if not os.path.exists(p):
                continue
            rep = json.load(open(p))
            for c in rep["cases"]:
                k = (c["format"].lower(), c["tokens"], rep["threads"], what)
                cell.setdefault(k, []).append((c["median_ms"], c["pct_of_read_bw"]))
    g = os.path.join(r, "compare", "ggml.json")
    if os.path.exists(g):
        for c in json.load(open(g)):
            if c["mode"] == "router":
                ggml.setdefault((c["type"].lower(), c["tokens"], c["threads"]), []).append(c["median_ms"])
DEFAULT_F32 = {"q4_1", "affine2-g64", "affine8-g64"}


def m(k, i=0):
    v = cell.get(k)
    return st.median(x[i] for x in v) if v else None


print("| format | default | T=1, 1 thr | T=1, 2 thr | T=8, 1 thr | T=8, 2 thr "
      "| % bw T=1, 2 thr | ÷ ggml T=1 / 8, 2 thr |")
print("|---|---|---|---|---|---|---|---|")
fmts = []
for k in cell:
    if k[0] not in fmts:
        fmts.append(k[0])
for f in fmts:
    dflt = "f32" if f in DEFAULT_F32 else "int"
    cols = []
    for t in (1, 8):
        for thr in (1, 2):
            a, b = m((f, t, thr, "f32")), m((f, t, thr, "q8"))
            cols.append(f"{a:.2f} → {b:.2f}" if a and b else "-")
    what = "f32" if dflt == "f32" else "q8"
    bw = m((f, 1, 2, what), 1)
    ratios = []
    for t in (1, 8):
        d, g = m((f, t, 2, "default")), ggml.get((f, t, 2))
        ratios.append(f"{d / st.median(g):.2f}" if d and g else "-")
    print(f"| {f} | {dflt} | " + " | ".join(cols) + f" | {bw:.0f}% | {' / '.join(ratios)} |")

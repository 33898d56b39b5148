#!/usr/bin/env python3
"""Medians over the rounds of run_rounds.sh: per format, T and threads, moekit
with f32 activations, with the integer kernels forced (q8) and with its
default (the compare.sh run), the % of the read bandwidth measured in the same
run, and ggml's router-mode time (same compare.sh run) with the ratio
moekit default / ggml.

usage: summarize.py ROUNDS_DIR > table.md
"""
import glob
import json
import os
import statistics as st
import sys

root = sys.argv[1]
rounds = sorted(glob.glob(os.path.join(root, "round*")))
cell = {}  # (fmt, T, thr, what) -> [(ms, pct_bw)]
bw = {}  # (what, thr) -> [GB/s]
other = {}


def add(path, what):
    if not os.path.exists(path):
        return
    rep = json.load(open(path))
    thr = rep["threads"]
    bw.setdefault((what, thr), []).append(rep["read_bw_gb_per_s"])
    for c in rep["cases"]:
        key = (c["format"].lower(), c["tokens"], thr, what)
        cell.setdefault(key, []).append((c["median_ms"], c["pct_of_read_bw"]))


ggml = {}
for r in rounds:
    for act in ("f32", "q8"):
        for t in (1, 2):
            add(os.path.join(r, f"{act}_t{t}.json"), act)
    for t in (1, 2):
        add(os.path.join(r, "compare", f"moekit_t{t}.json"), "default")
        o = os.path.join(r, "compare", f"moekit_t{t}.other")
        if os.path.exists(o):
            other.setdefault(("moekit", t), []).append(float(open(o).read() or "nan"))
    g = os.path.join(r, "compare", "ggml.json")
    if os.path.exists(g):
        for c in json.load(open(g)):
            if c["mode"] == "router":
                ggml.setdefault((c["type"].lower(), c["tokens"], c["threads"]), []).append(
                    c["median_ms"])
                other.setdefault(("ggml", c["threads"]), []).append(c.get("other_cpu_pct") or 0)


def med(v):
    return st.median(v) if v else None


def f(v, fmt="{:.3f}"):
    return fmt.format(v) if v is not None else "-"


print(f"{len(rounds)} rounds; medians. Read bandwidth (moekit's probe, same run), GB/s: " + ", ".join(
    f"{w} t={t}: {med(v):.1f} ({min(v):.1f}-{max(v):.1f})" for (w, t), v in sorted(bw.items())))
print()
print("other processes' CPU share during the runs (%, median/max): " + ", ".join(
    f"{w} t={t}: {med(v):.0f}/{max(v):.0f}" for (w, t), v in sorted(other.items())))
print()
print("| format | T | thr | f32 ms | f32 % bw | q8 ms | q8 % bw | q8/f32 | default ms | default % bw "
      "| ggml ms | default/ggml |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
fmts = []
for (fm, _, _, _) in cell:
    if fm not in fmts:
        fmts.append(fm)
for fm in fmts:
    for t in (1, 8):
        for thr in (1, 2):
            def get(what, i):
                v = cell.get((fm, t, thr, what))
                return med([x[i] for x in v]) if v else None
            f32, q8, de = get("f32", 0), get("q8", 0), get("default", 0)
            g = med(ggml.get((fm, t, thr), []))
            print("| " + " | ".join([
                fm, str(t), str(thr), f(f32), f(get("f32", 1), "{:.0f}%"), f(q8),
                f(get("q8", 1), "{:.0f}%"), f(q8 / f32 if q8 and f32 else None, "{:.2f}"), f(de),
                f(get("default", 1), "{:.0f}%"), f(g), f(de / g if de and g else None, "{:.2f}"),
            ]) + " |")

#!/usr/bin/env python3
"""moekit before/after vs ggml (router mode, plain `CPU` and `REPACK`
layouts) from a compare.sh directory and base-binary runs.

    ggml_table.py COMPARE_DIR BASE_DIR
"""
import json, os, sys
cmp_dir, base_dir = sys.argv[1], sys.argv[2]
g = {}
for c in json.load(open(os.path.join(cmp_dir, "ggml.json"))):
    if c["mode"] == "router":
        g[(c["type"].lower(), c["tokens"], c["threads"], c["layout"])] = (c["median_ms"], c["other_cpu_pct"])
def mk(path):
    d = json.load(open(path)); o = d.get("other_pct")
    return {(c["format"], c["tokens"]): c["median_ms"] for c in d["cases"]}, o
print("| type | T | thr | ggml plain ms (other %) | ggml repack ms | moekit before ms | moekit after ms | before ÷ plain | after ÷ plain | after ÷ repack |")
print("|---|---|---|---|---|---|---|---|---|---|")
for th in (1, 2):
    new, _ = mk(os.path.join(cmp_dir, f"moekit_t{th}.json"))
    bp = os.path.join(base_dir, f"base_t{th}_r0.json")
    base = mk(bp)[0] if os.path.exists(bp) else {}
    for (f, t), ms in sorted(new.items()):
        gp = g.get((f, t, th, "CPU")); gr = g.get((f, t, th, "REPACK"))
        b = base.get((f, t))
        fmt = lambda v: f"{v:.3f}" if v else "-"
        print(f"| {f} | {t} | {th} | {fmt(gp and gp[0])} ({gp and gp[1]:.0f}) | {fmt(gr and gr[0])} | {fmt(b)} | {ms:.3f} | "
              f"{(b / gp[0]) if (b and gp) else float('nan'):.2f} | {ms / gp[0] if gp else float('nan'):.2f} | "
              f"{ms / gr[0] if gr else float('nan'):.2f} |")

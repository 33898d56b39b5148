#!/usr/bin/env python3
"""Side-by-side table of a compare.sh run: ggml_moe_bench JSON + moekit bench JSONs.

usage: compare_table.py OUT_DIR   (reads ggml.json, moekit_t*.json, env.txt)
"""
import glob
import json
import os
import re
import sys


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    with open(os.path.join(out, "ggml.json")) as f:
        ggml = json.load(f)
    moekit = {}  # (type, T, threads) -> case
    mk_threads = {}
    for path in sorted(glob.glob(os.path.join(out, "moekit_t*.json"))):
        m = re.search(r"moekit_t(\d+)\.json$", path)
        with open(path) as f:
            rep = json.load(f)
        thr = int(rep.get("threads") or m.group(1))
        mk_threads[thr] = rep
        other = path[: -len(".json")] + ".other"
        if os.path.exists(other):
            rep["other_cpu_pct"] = float(open(other).read().strip() or "nan")
        for c in rep["cases"]:
            c["other_cpu_pct"] = None
            moekit[(c["format"].lower(), c["tokens"], thr)] = c
    for thr, rep in mk_threads.items():
        for c in rep["cases"]:
            c["other_cpu_pct"] = rep.get("other_cpu_pct")

    rows = {}  # (type, T, threads, layout) -> {mode: case}
    for c in ggml:
        key = (c["type"].lower(), c["tokens"], c["threads"], c["layout"])
        rows.setdefault(key, {})[c["mode"]] = c
    if not ggml:
        print("no ggml results")
        return 1
    g0 = ggml[0]
    print(f"ggml {g0['ggml_commit']} on {g0['cpu_model']}, preset {g0['preset']} "
          f"(E={g0['experts']} k={g0['top_k']} H={g0['hidden']} I={g0['intermediate']}), "
          f"gate/up {g0['gate_up']}, {g0['id_sets']} id sets rotated")
    for thr, rep in sorted(mk_threads.items()):
        print(f"moekit threads={thr}: {rep['device']}, read bandwidth {rep['read_bw_gb_per_s']:.1f} GB/s")
    print()
    print("ggml ids = experts only (routing given); ggml router = + f32 router, softmax, top-k, "
          "renormalise in the graph (what one moekit bench call covers). "
          "ratio = moekit ms / ggml router ms (ids ms if no router run); > 1 means moekit is slower.")
    print()
    hdr = ["type", "T", "thr", "ggml layout", "ggml ids ms", "ggml router ms", "moekit ms",
           "ratio", "ggml MB", "moekit MB", "ggml GB/s", "moekit GB/s", "moekit path",
           "other % (ggml/moekit)"]
    print("| " + " | ".join(hdr) + " |")
    print("|" + "|".join("---" for _ in hdr) + "|")

    def ms(c):
        return f"{c['median_ms']:.3f}" if c else "-"

    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2], k[3])):
        typ, t, thr, layout = key
        modes = rows[key]
        ids, rtr = modes.get("ids"), modes.get("router")
        base = rtr or ids
        mk = moekit.get((typ, t, thr))
        ratio = f"{mk['median_ms'] / base['median_ms']:.2f}" if mk and base else "-"
        print("| " + " | ".join([
            typ, str(t), str(thr), layout, ms(ids), ms(rtr), ms(mk), ratio,
            f"{base['weight_mb']:.1f}",
            f"{mk['weight_bytes'] / 1e6:.1f}" if mk else "-",
            f"{base['gb_per_s']:.1f}",
            f"{mk['gb_per_s']:.1f}" if mk else "-",
            mk.get("path", "-") if mk else "-",
            "{}/{}".format(
                f"{max(c.get('other_cpu_pct', 0) or 0 for c in modes.values()):.0f}",
                f"{mk['other_cpu_pct']:.0f}" if mk and mk.get("other_cpu_pct") is not None else "-"),
        ]) + " |")
    print()
    print("ggml MB: distinct routed experts' gate+up+down bytes, averaged over the id sets "
          "(+ the f32 router E*H*4 when the router mode ran); moekit MB: its weight_bytes "
          "(router f32 + experts hit, averaged over its 16 inputs). other %: CPU share other "
          "processes took while it was measured (ggml: per case, max over modes; moekit: its "
          "whole run at that thread count).")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Medians of ggml_vs_moekit_raw.txt (lines: who round threads type T ms)."""
import collections, statistics, sys

path = sys.argv[1] if len(sys.argv) > 1 else "ggml_vs_moekit_raw.txt"
d = collections.defaultdict(dict)
for line in open(path):
    f = line.split()
    if len(f) != 6:
        continue
    who, r, th, ty, t, ms = f
    d[(int(th), ty, int(t))].setdefault(who, {})[int(r)] = float(ms)
print("| thr | type | T | ggml plain ms | ggml repack ms | moekit fb9414a ms | moekit new ms "
      "| fb9414a ÷ ggml plain | new ÷ ggml plain | new ÷ ggml repack |")
print("|---|---|---|---|---|---|---|---|---|---|")
for k in sorted(d):
    w = d[k]
    med = lambda n: statistics.median(w[n].values()) if n in w else float("nan")
    def ratio(a, b):
        if a not in w or b not in w:
            return float("nan")
        return statistics.median([w[a][r] / w[b][r] for r in w[a] if r in w[b]])
    print(f"| {k[0]} | {k[1]} | {k[2]} | {med('ggml-CPU'):.3f} | {med('ggml-REPACK'):.3f} "
          f"| {med('moekit.s24base'):.3f} | {med('moekit.s24'):.3f} "
          f"| {ratio('moekit.s24base', 'ggml-CPU'):.2f} | {ratio('moekit.s24', 'ggml-CPU'):.2f} "
          f"| {ratio('moekit.s24', 'ggml-REPACK'):.2f} |")

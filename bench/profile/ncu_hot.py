"""Top instructions by stall samples from `ncu --page source --print-source sass --csv` (stdin)."""
import csv
import sys

rows = list(csv.reader(sys.stdin))
hdr = None
for i, r in enumerate(rows):
    if any("Source" == c or "Address" in c for c in r) and any("Sampling" in c for c in r):
        hdr, body = r, rows[i + 1:]
        break
if hdr is None:
    print("no source table; first rows:", rows[:3])
    sys.exit(0)
si = next(i for i, c in enumerate(hdr) if "Sampling (All" in c)
src = next(i for i, c in enumerate(hdr) if c == "Source")
tot = 0
items = []
for r in body:
    try:
        v = float(r[si])
    except (ValueError, IndexError):
        continue
    tot += v
    items.append((v, r[src]))
items.sort(reverse=True)
for v, s in items[:18]:
    print(f"{100 * v / max(tot, 1):5.1f}%  {s[:110]}")

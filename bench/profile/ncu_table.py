"""Condenses `ncu --csv --print-units base` output (stdin) to one line per kernel."""
import csv
import sys

rows = [r for r in csv.reader(sys.stdin) if len(r) > 10]
if not rows:
    print("(no ncu rows)")
    sys.exit(0)
h = rows[0]
ki, mi, vi, ii = (h.index(n) for n in ("Kernel Name", "Metric Name", "Metric Value", "ID"))
d = {}
for r in rows[1:]:
    d.setdefault((int(r[ii]), r[ki].split("(")[0][:44]), {})[r[mi]] = r[vi].replace(",", "")


def num(m, k):
    try:
        return float(m.get(k, "nan"))
    except ValueError:
        return float("nan")


for (i, k), m in sorted(d.items()):
    print(
        f"{k:44s} {num(m, 'gpu__time_duration.sum') / 1e3:8.2f} us"
        f"  inst {num(m, 'smsp__inst_executed.sum') / 1e3:9.1f} k"
        f"  dram {num(m, 'dram__bytes_read.sum') / 1e6:7.2f} MB"
        f"  grid {m.get('launch__grid_size', '?'):>6s} blk {m.get('launch__block_size', '?'):>5s}"
        f"  regs {m.get('launch__registers_per_thread', '?'):>4s}"
        f"  occ {num(m, 'sm__warps_active.avg.pct_of_peak_sustained_active'):5.1f}%"
    )

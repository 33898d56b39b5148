#!/usr/bin/env python3
"""Static check of tc_ra's register-A wgmma: no instruction may write a
register that an in-flight wgmma group reads as its A fragment (wgmma reads
them asynchronously, until the wgmma.wait_group that retires the group).

ptxas keeps the fragment registers of computing decoders until the wait, but
it once coalesced a fragment with the generic decoder's loop-carried storage
and let the next span's load overwrite it under the MMAs (NaNs in
tc_ra::every_format_matches_cpu, twenty-third session). This walks the SASS
of kernel instances, tracks the A registers of each committed group, retires
groups at `WARPGROUP.DEPBAR.LE gsb0, N`, and reports writes in between.
Straight-line approximation: it follows the listing in address order.

No GPU needed (CI runs the default sweep): NVRTC and nvdisasm from pip (nvidia-cuda-nvrtc,
nvidia-cuda-nvdisasm; see README), instances built by the dump_cubin example.
Usage (repository root):
  python3 scripts/wgmma_hazards.py                      # a default sweep
  python3 scripts/wgmma_hazards.py 'moekit::tc_ra<moekit::FmtQ4_K, __nv_bfloat16, 2, 64>'
Exit status 1 when any instance has a hazard or does not compile.
"""
import os
import re
import subprocess
import sys
import tempfile

FORMATS = [
    "moekit::FmtAffine<4, __nv_bfloat16>", "moekit::FmtAffine<2, __half>", "moekit::FmtAffine<3, __nv_bfloat16>",
    "moekit::FmtAffine<8, __nv_bfloat16>", "moekit::FmtQ4_K", "moekit::FmtQ4_0", "moekit::FmtQ8_0",
    "moekit::FmtIQ4_XS", "moekit::FmtNVFP4", "moekit::FmtFp8Block",
]


def nvdisasm():
    import nvidia  # pip's CUDA packages
    return os.path.join(list(nvidia.__path__)[0], "cu13", "bin", "nvdisasm")


def dests(text):
    m = re.search(r"/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s+(.*?);", text)
    if not m:
        return []
    op, args = m.group(2), m.group(3)
    if op.startswith(("ST", "BRA", "BAR", "HGMMA", "WARPGROUP", "DEPBAR", "LDGSTS", "EXIT", "RED", "ATOM", "CCTL",
                      "MEMBAR", "FENCE", "ISETP", "FSETP", "HSETP", "PLOP3")):
        return []
    r = re.match(r"R(\d+)$", args.split(",")[0].strip())
    if not r:
        return []
    n, w = int(r.group(1)), 1
    if ".64" in op or op.startswith("IMAD.WIDE"):
        w = 2
    if ".128" in op:
        w = 4
    return list(range(n, n + w))


def hazards(sass):
    lines = [re.sub(r"/\* 0x[0-9a-f]+ \*/", "", l).strip() for l in sass.split("\n")]
    inflight, cur, found = [], set(), []
    for t in lines:
        if not re.search(r"/\*[0-9a-f]{4,}\*/", t):
            continue
        if "HGMMA" in t:
            m = re.search(r"HGMMA\S*\s+R\d+,\s+R(\d+),", t)
            if m:
                cur |= set(range(int(m.group(1)), int(m.group(1)) + 4))
            if "gsb0" in t:
                inflight.append(cur)
                cur = set()
            continue
        m = re.search(r"WARPGROUP.DEPBAR.LE gsb0, 0x(\d)", t)
        if m:
            while len(inflight) > int(m.group(1)):
                inflight.pop(0)
            continue
        d = set(dests(t))
        if any(d & g for g in inflight):
            found.append(t)
    return found


def main():
    exprs = sys.argv[1:] or [f"moekit::tc_ra<{f}, __nv_bfloat16, {p}, {bm}>" for f in FORMATS for p in (1, 2)
                             for bm in (16, 64)]
    subprocess.run(["cargo", "build", "-q", "-p", "moekit", "--example", "dump_cubin"], check=True)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        for e in exprs:
            r = subprocess.run(["target/debug/examples/dump_cubin", "tc_ra.cu", e, cubin], capture_output=True, text=True)
            if r.returncode != 0:
                # A sweep entry that no longer compiles (a renamed format)
                # must not pass silently.
                print(f"{e}: does not compile ({r.stderr.strip()[-120:]})")
                bad += 1
                continue
            sass = subprocess.run([nvdisasm(), "-c", cubin], capture_output=True, text=True).stdout
            h = hazards(sass)
            bad += bool(h)
            print(f"{e}: {len(h)} hazards" + (f", first: {h[0][:90]}" if h else ""))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

"""Regenerates every committed test fixture of moekit.

Usage (from the repository root):

    pip install -r scripts/requirements.txt && python3 scripts/gen_fixtures.py
    python3 scripts/gen_fixtures.py --only moe,ggml      # some areas only
    python3 scripts/gen_fixtures.py --list                # show areas, run nothing

Each fixture area is one script ``scripts/fixtures/<name>.py`` (files starting
with ``_`` are skipped).  Every such script is runnable as
``python3 scripts/fixtures/<name>.py OUTDIR`` (and also exposes ``main(outdir)``);
this driver runs each in its own Python process (so seeds and global state of
one oracle cannot leak into another) with ``OUTDIR = fixtures/<area>/``.

The area is the script's file stem, unless the script sets a top-level string
constant ``AREA = "..."`` (read statically, without importing the script); e.g.
``moe_blocks.py`` declares ``AREA = "moe"`` and writes ``fixtures/moe/``.

All areas run even when one fails; the exit status is non-zero if any failed.
The oracles are deterministic: rerunning must reproduce the committed files
byte for byte (check with ``git status fixtures/``).
"""

import argparse
import ast
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts", "fixtures")
FIXTURES = os.path.join(ROOT, "fixtures")


def area_of(script):
    """Fixture area of a script: its `AREA = "..."` constant, else its stem."""
    with open(script, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=script)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "AREA"
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            return node.value.value
    return os.path.splitext(os.path.basename(script))[0]


def discover():
    """[(area, script path)] for every scripts/fixtures/<name>.py, sorted."""
    found = []
    for name in sorted(os.listdir(SCRIPTS)):
        if name.endswith(".py") and not name.startswith("_"):
            path = os.path.join(SCRIPTS, name)
            found.append((area_of(path), path))
    areas = [a for a, _ in found]
    dup = sorted({a for a in areas if areas.count(a) > 1})
    if dup:
        sys.exit(f"two scripts write the same fixture area: {dup}")
    return found


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated areas to regenerate")
    ap.add_argument("--list", action="store_true", help="list areas and exit")
    args = ap.parse_args(argv)

    jobs = discover()
    if args.list:
        for area, script in jobs:
            print(f"{area:12s} {os.path.relpath(script, ROOT)}")
        return 0
    if args.only:
        wanted = {a.strip() for a in args.only.split(",") if a.strip()}
        unknown = wanted - {a for a, _ in jobs}
        if unknown:
            sys.exit(f"unknown areas {sorted(unknown)}; have {[a for a, _ in jobs]}")
        jobs = [(a, s) for a, s in jobs if a in wanted]
    if not jobs:
        sys.exit(f"no fixture scripts found in {SCRIPTS}")

    failed = []
    for area, script in jobs:
        outdir = os.path.join(FIXTURES, area)
        os.makedirs(outdir, exist_ok=True)
        print(f"== {area}: {os.path.relpath(script, ROOT)} -> "
              f"{os.path.relpath(outdir, ROOT)}/", flush=True)
        t0 = time.time()
        rc = subprocess.call([sys.executable, script, outdir], cwd=ROOT)
        print(f"== {area}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} "
              f"in {time.time() - t0:.1f}s", flush=True)
        if rc != 0:
            failed.append(area)
    if failed:
        print(f"failed areas: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

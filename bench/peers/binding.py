#!/usr/bin/env python3
"""moekit through its Python binding beside the PyTorch peer, in one process,
on the same tensors (issue 14).

For a preset's shape (torch_moe.py's presets) it builds torch_moe's bf16 block
and hands the very same bf16 weights to moekit (`Experts.from_parts("bf16",
...)`: router, gate|up, down), plus a second moekit layer of random MLX affine
4-bit weights of that shape. For each T it times, with CUDA events (medians):

* ``eager_us``   -- one Python call `layer(x, out=out)` (binding + launches),
* ``graph_us``   -- one replay of that call captured in ``torch.cuda.graph``,
* ``b2b_us``     -- 32 replays back to back / 32 (as `moekit bench`'s graph_b2b_ms),

and the same graph timings for torch_moe's ``grouped_mm`` block, plus the NMSE
of moekit's bf16 output against torch's on the same x. Compare ``graph_us`` /
``b2b_us`` with `moekit bench --device cuda --dtype bf16` (the Rust path) run
in the same session: the binding's overhead under graph replay is the
difference.

    python3 bench/peers/binding.py --preset qwen3-30b-a3b --tokens 1,8,64,512 --json out.json
"""

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_moe  # noqa: E402


def median_us(fn, reps=200, warmup=20, inner=1):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / inner)
    return statistics.median(ts)


def graph_of(fn):
    return torch_moe.capture_graph(fn)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="qwen3-30b-a3b")
    ap.add_argument("--tokens", default="1,8,64,512")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch_moe.load_torch(False)
    import torch

    import moekit

    dev = torch.device("cuda", 0)
    p = torch_moe.PRESETS[args.preset]
    assert not p.Is, "presets with a shared expert: not in this comparison"
    blk = torch_moe.Block(p, dev, torch.bfloat16, seed=0)
    assert blk.Hp == p.H and blk.Ip == p.I, "padded presets are not compared"
    rule = "softmax_topk" if p.router == "softmax_topk" else "topk_softmax"
    E, H, I = p.E, p.H, p.I  # noqa: E741
    bf16 = moekit.Layer.from_parts(
        moekit.Experts.from_parts("bf16", (1, E, H), blk.Wr.contiguous()),
        moekit.Experts.from_parts("bf16", (E, 2 * I, H), blk.Wgu.contiguous()), None,
        moekit.Experts.from_parts("bf16", (E, H, I), blk.Wd.contiguous()),
        p.k, rule=rule, norm_topk_prob=p.norm)
    # As `moekit bench --format affine4`'s block: dense f32 router, f16 scales.
    aff = moekit.Layer.from_parts(
        moekit.Experts.random("f32", (1, E, H), seed=1).to("cuda"),
        moekit.Experts.random("affine4-g64", (E, I, H), seed=2).to("cuda"),
        moekit.Experts.random("affine4-g64", (E, I, H), seed=3).to("cuda"),
        moekit.Experts.random("affine4-g64", (E, H, I), seed=4).to("cuda"),
        p.k, rule=rule, norm_topk_prob=p.norm)
    # Host time of one eager call at T = 1 and of its parts (perf_counter, 200
    # calls, no sync inside): where the binding's eager overhead goes.
    import time

    def host_us(fn, n=200):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / n * 1e6

    x1 = torch_moe.make_x(blk, 1, 0)
    o1 = torch.empty_like(x1)
    s1 = torch.cuda.current_stream(dev).cuda_stream
    host = {
        "layer_call": host_us(lambda: aff(x1, out=o1)),
        "native_forward": host_us(lambda: aff._native.forward(x1, o1, s1, "auto")),
        "current_stream": host_us(lambda: torch.cuda.current_stream(x1.device).cuda_stream),
        "dlpack_export": host_us(lambda: x1.__dlpack__(stream=-1)),
        "torch_grouped": host_us(lambda: torch_moe.moe_grouped(blk, x1)),
    }
    print("host us per call (T = 1, affine4):", json.dumps({k: round(v, 1) for k, v in host.items()}), flush=True)
    rows = []
    for t in [int(v) for v in args.tokens.split(",")]:
        x = torch_moe.make_x(blk, t, 0)
        row = {"preset": p.name, "tokens": t, "device": torch.cuda.get_device_name(0),
               "torch": torch.__version__}
        ref = torch_moe.moe_grouped(blk, x)
        for name, lay in (("bf16", bf16), ("affine4", aff)):
            out = torch.empty_like(x)
            call = lambda lay=lay, out=out: lay(x, out=out)  # noqa: E731
            row[f"{name}_eager_us"] = median_us(call)
            g = graph_of(call)
            row[f"{name}_graph_us"] = median_us(g.replay)
            row[f"{name}_b2b_us"] = median_us(g.replay, reps=50, inner=32)
            row[f"{name}_path"] = lay.plan(t)[0]
            if name == "bf16":
                call()
                torch.cuda.synchronize()
                row["bf16_nmse_vs_torch"] = float(((out.double() - ref.double()) ** 2).sum()
                                                  / (ref.double() ** 2).sum())
        tg = graph_of(lambda: torch_moe.moe_grouped(blk, x))
        row["torch_graph_us"] = median_us(tg.replay)
        row["torch_b2b_us"] = median_us(tg.replay, reps=50, inner=32)
        rows.append(row)
        print(json.dumps(row), flush=True)
    hdr = ("T", "bf16 eager", "bf16 graph", "bf16 b2b", "aff4 eager", "aff4 graph", "aff4 b2b",
           "torch graph", "torch b2b", "nmse bf16")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in rows:
        print(f"| {r['tokens']} | {r['bf16_eager_us']:.1f} | {r['bf16_graph_us']:.1f} | {r['bf16_b2b_us']:.1f} "
              f"| {r['affine4_eager_us']:.1f} | {r['affine4_graph_us']:.1f} | {r['affine4_b2b_us']:.1f} "
              f"| {r['torch_graph_us']:.1f} | {r['torch_b2b_us']:.1f} | {r['bf16_nmse_vs_torch']:.2e} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "host_us_t1_affine4": host}, f, indent=1)


if __name__ == "__main__":
    main()

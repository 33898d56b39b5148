#!/usr/bin/env python3
"""PyTorch peer benchmark for moekit's whole MoE block (see README.md beside this file).

Times the same block as `moekit bench --device cuda` (router matvec, routing
rule of the preset, top-k experts with SwiGLU, weighted combine, shared expert)
with bf16 weights and activations, two ways:

* ``eager``      -- Hugging-Face-style Python loop over the experts that were hit
                    (as transformers' Qwen3MoeSparseMoeBlock); host syncs, so
                    plain mode only (not CUDA-graph capturable).
* ``grouped_mm`` -- expert sort on the GPU (torch.sort + searchsorted offsets),
                    one ``torch._grouped_mm`` for gate|up and one for down,
                    unpermute + weighted combine with one bmm; no host syncs,
                    so also timed as one replayed CUDA graph.

Usage (on the GPU machine, torch >= 2.8 with CUDA, an sm90 GPU for the
grouped_mm fast path)::

    python3 bench/peers/torch_moe.py --preset qwen3-30b-a3b --tokens 1,8,32,64 --json out.json
    python3 bench/peers/torch_moe.py                 # every preset, full token sweep
    python3 bench/peers/torch_moe.py --device cpu --smoke   # tiny CPU self-test;
                                                     # runs on numpy if torch is absent
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys
import time

torch = None  # bound by load_torch(): the real torch, or the numpy stand-in for --smoke
F = None


@dataclasses.dataclass(frozen=True)
class Preset:
    """An MoE layer shape and routing rule (mirrors crates/moekit-cli/src/presets.rs)."""

    name: str
    E: int  # routed experts
    k: int  # experts per token
    H: int  # hidden size
    I: int  # expert intermediate size  # noqa: E741
    Is: int = 0  # shared-expert intermediate size (0 = none)
    gated: bool = False  # shared expert output x sigmoid(x . g)
    router: str = "softmax_topk"  # or "topk_softmax"
    norm: bool = False  # softmax_topk: renormalise the chosen k weights


PRESETS = {
    p.name: p
    for p in [
        Preset("qwen3-30b-a3b", 128, 8, 2048, 768, router="softmax_topk", norm=True),
        Preset("mixtral-8x7b", 8, 2, 4096, 14336, router="topk_softmax"),
        # DeepSeek-V2-Lite: 2 shared experts of 1408 == one of 2816, ungated; grouped
        # router with softmax scoring, n_group=1, no renorm, scale 1 == softmax_topk.
        Preset("deepseek-v2-lite", 64, 6, 2048, 1408, Is=2 * 1408, router="softmax_topk"),
        Preset("gpt-oss-20b", 32, 4, 2880, 2880, router="topk_softmax"),
        Preset("qwen3-next-80b", 512, 10, 2048, 512, Is=512, gated=True, router="softmax_topk"),
    ]
}
# Tiny shapes for --smoke; H, I, Is not multiples of 16 so the padding paths run.
SMOKE_PRESETS = {
    p.name: p
    for p in [
        Preset("smoke-shared-gated", 8, 3, 24, 20, Is=12, gated=True, norm=True),
        Preset("smoke-topk-softmax", 6, 2, 32, 40, router="topk_softmax"),
        Preset("smoke-shared", 5, 4, 16, 8, Is=24),
    ]
}
ALIGN = 16  # K and N of every grouped_mm operand are padded (with zeros) to a multiple of this
NMSE_MAX = 1e-3  # grouped_mm vs eager, bf16
SMOKE_NMSE_MAX = 1e-8  # f32 vs the float64 numpy reference


def _round_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


# ----------------------------------------------------------------------------- weights


class Block:
    """Random weights of one preset, laid out for both implementations.

    ``Wgu [E, 2Ip, Hp]`` holds gate rows ``[:I]`` and up rows ``[Ip:Ip+I]``; ``Wd
    [E, Hp, Ip]``; the shared expert likewise. Padding rows/columns are zero, so
    they change no result; the eager path uses unpadded views."""

    def __init__(self, p: Preset, device, dtype, seed: int):
        self.p, self.device, self.dtype = p, device, dtype
        E, H, I, Is = p.E, p.H, p.I, p.Is  # noqa: E741
        self.Hp, self.Ip, self.Isp = _round_up(H), _round_up(I), _round_up(Is) if Is else 0
        g = torch.Generator(device=device).manual_seed(seed)

        def rnd(true_shape, pad_shape, std):
            t = torch.randn(true_shape, generator=g, device=device, dtype=dtype).mul_(std)
            if tuple(true_shape) == tuple(pad_shape):
                return t
            z = torch.zeros(pad_shape, device=device, dtype=dtype)
            z[tuple(slice(0, n) for n in true_shape)] = t
            return z

        hs, is_ = H**-0.5, I**-0.5
        self.Wr = rnd((E, H), (E, H), hs)
        gate = rnd((E, I, H), (E, self.Ip, self.Hp), hs)
        up = rnd((E, I, H), (E, self.Ip, self.Hp), hs)
        self.Wgu = torch.cat([gate, up], dim=1)
        del gate, up
        self.Wd = rnd((E, H, I), (E, self.Hp, self.Ip), is_)
        # grouped_mm wants B as [E, K, N]: a transposed view, K contiguous.
        self.Wgu_t, self.Wd_t = self.Wgu.transpose(1, 2), self.Wd.transpose(1, 2)
        self.erange = torch.arange(E, device=device)
        if Is:
            sg = rnd((Is, H), (self.Isp, self.Hp), hs)
            su = rnd((Is, H), (self.Isp, self.Hp), hs)
            self.Wsgu = torch.cat([sg, su], dim=0)
            self.Wsd = rnd((H, Is), (self.Hp, self.Isp), Is**-0.5)
            self.Wsgate = rnd((1, H), (1, self.Hp), hs) if p.gated else None
        self.elt = self.Wr.element_size()

    # HF-style per-expert weights (views, unpadded).
    def gate(self, e):
        return self.Wgu[e, : self.p.I, : self.p.H]

    def up(self, e):
        return self.Wgu[e, self.Ip : self.Ip + self.p.I, : self.p.H]

    def down(self, e):
        return self.Wd[e, : self.p.H, : self.p.I]

    def weight_bytes(self, ids) -> int:
        """Router + union of selected experts + shared expert (as MoeBlock::weight_bytes_touched)."""
        p = self.p
        hit = len(set(ids.reshape(-1).tolist()))
        shared = 3 * p.H * p.Is + (p.H if p.gated else 0)
        return self.elt * (p.E * p.H + hit * 3 * p.H * p.I + shared)

    def flops(self, t: int) -> int:
        """As MoeBlock::flops: 2 * T * (E*H + k*3*H*I + 3*H*Is)."""
        p = self.p
        return 2 * t * (p.E * p.H + p.k * 3 * p.H * p.I + 3 * p.H * p.Is)


def make_x(blk: Block, t: int, seed: int):
    g = torch.Generator(device=blk.device).manual_seed(seed ^ t)
    x = torch.rand((t, blk.p.H), generator=g, device=blk.device, dtype=torch.float32)
    return (x * 2 - 1).to(blk.dtype)


# ----------------------------------------------------------------------------- the block


def route(blk: Block, x):
    """Router logits (model dtype, as nn.Linear) -> f32 weights [T,k], int64 ids [T,k]."""
    p = blk.p
    logits = F.linear(x, blk.Wr).float()
    if p.router == "softmax_topk":  # Qwen3-MoE (norm), Qwen3-Next / DeepSeek-V2 (no norm)
        w, ids = torch.topk(torch.softmax(logits, dim=-1), p.k, dim=-1)
        if p.norm:
            w = w / w.sum(dim=-1, keepdim=True)
    else:  # Mixtral, gpt-oss: top-k on logits, softmax over the chosen k
        v, ids = torch.topk(logits, p.k, dim=-1)
        w = torch.softmax(v, dim=-1)
    return w, ids


def moe_eager(blk: Block, x):
    """transformers' Qwen3MoeSparseMoeBlock.forward, expert by expert."""
    p = blk.p
    w, ids = route(blk, x)
    w = w.to(x.dtype)
    out = torch.zeros_like(x)
    mask = F.one_hot(ids, num_classes=p.E).permute(2, 1, 0)  # [E, k, T]
    hit = (mask.sum(dim=(1, 2)) > 0).nonzero().flatten().tolist()  # host sync
    for e in hit:
        slot, tok = torch.where(mask[e])  # host sync per expert
        xe = x[tok]
        ye = F.linear(F.silu(F.linear(xe, blk.gate(e))) * F.linear(xe, blk.up(e)), blk.down(e))
        out.index_add_(0, tok, ye * w[tok, slot, None])
    if p.Is:
        H, Is = p.H, p.Is
        sy = F.linear(
            F.silu(F.linear(x, blk.Wsgu[:Is, :H])) * F.linear(x, blk.Wsgu[blk.Isp : blk.Isp + Is, :H]),
            blk.Wsd[:H, :Is],
        )
        if p.gated:
            sy = torch.sigmoid(F.linear(x, blk.Wsgate[:, :H])) * sy
        out = out + sy
    return out


_CPU_GROUPED_MM = [True]  # try torch._grouped_mm on the CPU once, then loop


def grouped_mm(a, b, offs):
    """a [M, K] rows sorted by group, b [G, K, N], offs int32 [G] cumulative row ends."""
    if getattr(a, "is_cuda", False):
        gmm = getattr(torch, "_grouped_mm", None) or F.grouped_mm  # F.grouped_mm: the public name in newer torch
        return gmm(a, b, offs=offs)
    if _CPU_GROUPED_MM[0] and hasattr(torch, "_grouped_mm"):
        try:
            return torch._grouped_mm(a, b, offs=offs)
        except (RuntimeError, NotImplementedError, TypeError):
            _CPU_GROUPED_MM[0] = False
    out = a.new_zeros((a.shape[0], b.shape[-1]))
    start = 0
    for gi, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = a[start:end] @ b[gi]
        start = end
    return out


def pad_groups(xs, sorted_ids, offs, align: int, n_experts: int):
    """Moves each expert's rows to a start that is a multiple of `align` (static size
    M + E*(align-1), so capturable). Padding rows are left uninitialised: GEMM rows are
    independent and those rows are never read back."""
    m = xs.shape[0]
    ends = offs.long()
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    pcounts = (counts + (align - 1)) // align * align
    pends = torch.cumsum(pcounts, 0)
    shift = (pends - pcounts) - (ends - counts)  # padded start - packed start, per expert
    dest = torch.arange(m, device=xs.device) + shift[sorted_ids]
    xpad = xs.new_empty((m + n_experts * (align - 1), xs.shape[1]))
    xpad.index_copy_(0, dest, xs)
    return xpad, pends.to(torch.int32), dest


def moe_grouped(blk: Block, x, align: int = 1):
    """Sort by expert -> grouped_mm(gate|up) -> SwiGLU -> grouped_mm(down) -> unpermute + combine."""
    p = blk.p
    t = x.shape[0]
    w, ids = route(blk, x)
    xp = x if blk.Hp == p.H else F.pad(x, (0, blk.Hp - p.H))
    sorted_ids, order = torch.sort(ids.reshape(-1), stable=True)
    offs = torch.searchsorted(sorted_ids, blk.erange, right=True, out_int32=True)
    xs = xp.index_select(0, order // p.k)  # [T*k, Hp], expert-sorted
    if align > 1:
        xs, offs, dest = pad_groups(xs, sorted_ids, offs, align, p.E)
    gu = grouped_mm(xs, blk.Wgu_t, offs)  # [M, 2Ip]
    act = F.silu(gu[:, : blk.Ip]) * gu[:, blk.Ip :]
    ys = grouped_mm(act, blk.Wd_t, offs)  # [M, Hp]
    if align > 1:
        ys = ys.index_select(0, dest)
    y = torch.empty_like(ys).index_copy_(0, order, ys)  # back to (token, slot) order
    out = torch.bmm(w.to(x.dtype).unsqueeze(1), y.view(t, p.k, blk.Hp)).squeeze(1)  # [T, Hp]
    if p.Is:
        s = F.linear(xp, blk.Wsgu)
        sy = F.linear(F.silu(s[:, : blk.Isp]) * s[:, blk.Isp :], blk.Wsd)
        if p.gated:
            sy = sy * torch.sigmoid(F.linear(xp, blk.Wsgate))
        out = out + sy
    return out if blk.Hp == p.H else out[:, : p.H]


def nmse(a, b) -> float:
    """sum((a-b)^2) / sum(b^2), b the reference (ggml test-backend-ops)."""
    a, b = a.float(), b.float()
    den = (b**2).sum().item()
    return ((a - b) ** 2).sum().item() / den if den > 0 else float("inf")


# ----------------------------------------------------------------------------- measuring


class Timer:
    """Median wall time of one call in ms: CUDA events on a GPU (one event pair and a
    sync per repeat, as moekit's time_ms), perf_counter on the CPU."""

    def __init__(self, device, flush_l2_bytes: int = 0):
        self.cuda = device.type == "cuda"
        self.l2 = None
        if self.cuda and flush_l2_bytes:
            self.l2 = torch.empty(flush_l2_bytes // 4, dtype=torch.float32, device=device)

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def median_ms(self, fn, reps: int, warmup: int) -> float:
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(reps):
            if self.l2 is not None:
                self.l2.zero_()
                self.sync()
            if self.cuda:
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


def measure_context(device, timer: Timer, bw_gib: float, gemm_n: int) -> dict:
    """Read bandwidth (torch.sum over a bf16 buffer, bytes read / median time), copy
    bandwidth (bytes read + written) and a dense bf16 GEMM rate."""
    n = int(bw_gib * 2**30) // 2

    def sum_ms():
        buf = torch.empty(n, dtype=torch.bfloat16, device=device).uniform_(-1, 1)
        return timer.median_ms(buf.sum, 20, 3)

    def copy_ms():
        src = torch.empty(n // 2, dtype=torch.bfloat16, device=device).uniform_(-1, 1)
        dst = torch.empty_like(src)
        return timer.median_ms(lambda: dst.copy_(src), 20, 3)

    def gemm_ms():
        a = torch.randn((gemm_n, gemm_n), device=device, dtype=torch.bfloat16)
        b = torch.randn((gemm_n, gemm_n), device=device, dtype=torch.bfloat16)
        return timer.median_ms(lambda: a @ b, 10, 3)

    read_bw, ms_copy, ms_mm = n * 2 / (sum_ms() * 1e-3) / 1e9, copy_ms(), gemm_ms()
    return {
        "read_bw_gb_per_s": read_bw,
        "read_bw_method": f"torch.sum over {bw_gib:g} GiB of bf16; bytes read / median time of 20",
        "copy_gb_per_s": 2 * (n // 2) * 2 / (ms_copy * 1e-3) / 1e9,
        "copy_method": "dst.copy_(src) of half that size; bytes read + written / median of 20",
        "gemm_bf16_tflop_per_s": 2 * gemm_n**3 / (ms_mm * 1e-3) / 1e12,
        "gemm_method": f"{gemm_n}x{gemm_n}x{gemm_n} bf16 a @ b, median of 10",
    }


def capture_graph(fn):
    """Warm up on a side stream, then capture one call into a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    torch.cuda.synchronize()
    return g, out


_API_LAUNCH = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cudaMemcpy", "cudaMemset")
_API_SYNC = ("cudaStreamSynchronize", "cudaEventSynchronize")


def count_launches(fn) -> dict:
    """Profiles one call (after one unprofiled call) with torch.profiler, CPU + CUDA
    activities. launches = GPU operations executed (kernels + memcpy + memset
    records from CUPTI; in a graph replay, its kernel nodes); api_calls = host
    launch calls (cudaLaunchKernel*, cuLaunchKernel*, cudaGraphLaunch, cudaMemcpy*,
    cudaMemset*); host_syncs = cudaStreamSynchronize/cudaEventSynchronize calls."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    d = {"kernels": 0, "memcpy": 0, "memset": 0, "api_calls": 0, "host_syncs": 0}
    for ev in prof.events():
        name = ev.name
        if str(getattr(ev, "device_type", "")).endswith("CUDA"):
            key = "memcpy" if name.startswith("Memcpy") else "memset" if name.startswith("Memset") else "kernels"
            d[key] += 1
        elif name.startswith(_API_LAUNCH):
            d["api_calls"] += 1
        elif name in _API_SYNC:
            d["host_syncs"] += 1
    d["launches"] = d["kernels"] + d["memcpy"] + d["memset"]
    return d


# ----------------------------------------------------------------------------- benchmark


def impl_fn(impl: str, blk: Block, x, align: int):
    if impl == "eager":
        return lambda: moe_eager(blk, x)
    return lambda: moe_grouped(blk, x, align)


def bench_preset(p: Preset, args, device, dtype, timer: Timer, ctx: dict) -> dict:
    t0 = time.time()
    blk = Block(p, device, dtype, args.seed)
    bw = ctx["read_bw_gb_per_s"]
    cuda = device.type == "cuda"
    report = {
        "preset": p.name,
        "device": ctx["device"],
        "dtype": str(dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float32", "f32"),
        "threads": torch.get_num_threads(),
        "read_bw_gb_per_s": bw,
        "cases": [],
        "peer": "torch",
        **{k: v for k, v in ctx.items() if k not in ("device", "read_bw_gb_per_s")},
        "group_align": args.group_align,
        "padding": (
            "none needed: H, I, Is are multiples of 16"
            if (blk.Hp, blk.Ip, blk.Isp) == (p.H, p.I, p.Is)
            else f"zero-padded to H={blk.Hp} I={blk.Ip} Is={blk.Isp} (multiples of {ALIGN}) for grouped_mm"
        ),
        "errors": [],
        "notes": [],
    }
    if "eager" in args.impl and "graph" in args.modes and cuda:
        report["notes"].append(
            "eager has no graph mode: it syncs with the host (nonzero/tolist, torch.where per expert) and"
            " its Python loop runs over a data-dependent list of experts, so it cannot be captured"
        )
    print(
        f"\npreset {p.name} (E={p.E} k={p.k} H={p.H} I={p.I} shared={p.Is}{' gated' if p.gated else ''}"
        f" router={p.router}{' norm' if p.norm else ''}), {report['padding']}"
    )
    # Numerics: once per preset, grouped_mm vs eager at the largest T.
    tv = args.validate_tokens or max(args.tokens)
    xv = make_x(blk, tv, args.seed)
    ref = moe_eager(blk, xv)
    e = nmse(moe_grouped(blk, xv, args.group_align), ref)
    report["validation"] = {"tokens": tv, "nmse_grouped_mm_vs_eager": e, "max": NMSE_MAX, "pass": e <= NMSE_MAX}
    for note in report["notes"]:
        print(f"  note: {note}")
    print(f"  validate T={tv}: NMSE(grouped_mm vs eager) = {e:.3e}  {'PASS' if e <= NMSE_MAX else 'FAIL'}")
    del xv, ref
    print(
        f"  {'impl':<11}{'mode':<6}{'T':>5}{'median ms':>11}{'weight MB':>11}{'GB/s':>9}{'% bw':>7}"
        f"{'floor ms':>10}{'x floor':>9}{'GFLOP/s':>10}{'hit':>5}"
    )
    for t in args.tokens:
        x = make_x(blk, t, args.seed)
        _, ids = route(blk, x)
        wbytes = blk.weight_bytes(ids)
        hit = len(set(ids.reshape(-1).tolist()))
        floor_ms = wbytes / (bw * 1e9) * 1e3
        for impl in args.impl:
            for mode in args.modes:
                if mode == "graph" and (impl == "eager" or not cuda):
                    continue
                case = {"impl": impl, "mode": mode}
                try:
                    fn = impl_fn(impl, blk, x, args.group_align)
                    if mode == "graph":
                        plain = fn()
                        g, gout = capture_graph(fn)
                        g.replay()
                        torch.cuda.synchronize()
                        case["nmse_vs_plain"] = nmse(gout, plain)
                        del plain
                        ms = timer.median_ms(g.replay, args.repeats, args.warmup)
                        del g, gout
                    else:
                        ms = timer.median_ms(fn, args.repeats, args.warmup)
                except Exception as err:  # noqa: BLE001 -- report and go on with other cases
                    msg = f"{impl}/{mode} T={t}: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
                    print("  ERROR " + msg)
                    report["errors"].append(msg)
                    continue
                gbs = wbytes / (ms * 1e-3) / 1e9
                case = {
                    "format": report["dtype"],
                    "tokens": t,
                    "median_ms": ms,
                    "repeats": args.repeats,
                    "weight_bytes": wbytes,
                    "gb_per_s": gbs,
                    "pct_of_read_bw": 100 * gbs / bw,
                    "gflop_per_s": blk.flops(t) / (ms * 1e-3) / 1e9,
                    **case,
                    "floor_ms": floor_ms,
                    "x_floor": ms / floor_ms,
                    "launches": None,
                    "experts_hit": hit,
                }
                report["cases"].append(case)
                print(
                    f"  {impl:<11}{mode:<6}{t:>5}{ms:>11.4f}{wbytes / 1e6:>11.1f}{gbs:>9.1f}"
                    f"{case['pct_of_read_bw']:>6.1f}%{floor_ms:>10.4f}{case['x_floor']:>9.2f}"
                    f"{case['gflop_per_s']:>10.1f}{hit:>5}"
                )
        del x
    del blk
    if cuda:
        torch.cuda.empty_cache()
    print(f"  ({time.time() - t0:.1f} s)")
    return report


def add_launches(report: dict, p: Preset, args, device, dtype) -> None:
    """Second pass (after all timing, since a profiler session can leave CUPTI hooks
    that slow later launches): kernel counts for the cases at --launch-tokens."""
    blk = Block(p, device, dtype, args.seed)
    for case in report["cases"]:
        if case["tokens"] not in args.launch_tokens:
            continue
        x = make_x(blk, case["tokens"], args.seed)
        fn = impl_fn(case["impl"], blk, x, args.group_align)
        try:
            if case["mode"] == "graph":
                g, _ = capture_graph(fn)
                d = count_launches(g.replay)
                del g
            else:
                d = count_launches(fn)
        except Exception as err:  # noqa: BLE001
            report["errors"].append(f"launch count {case['impl']}/{case['mode']}: {type(err).__name__}: {err}")
            continue
        case["launches"] = d["launches"]
        case["launch_detail"] = d
        print(
            f"  {p.name:<18}{case['impl']:<11}{case['mode']:<6}T={case['tokens']:<4} launches={d['launches']:<5}"
            f" (kernels {d['kernels']}, memcpy {d['memcpy']}, memset {d['memset']};"
            f" host launch calls {d['api_calls']}, host syncs {d['host_syncs']})"
        )
    del blk
    torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- smoke test


def reference_numpy(blk: Block, x):
    """Float64 per-token loop written straight from the routing rules (independent of
    both implementations above). Returns (out [T,H], per-token chosen expert lists)."""
    import numpy as np

    def npy(t):
        return t.detach().float().cpu().numpy().astype(np.float64)

    p = blk.p
    X, Wr = npy(x), npy(blk.Wr)
    G = npy(blk.Wgu[:, : p.I, : p.H])
    U = npy(blk.Wgu[:, blk.Ip : blk.Ip + p.I, : p.H])
    D = npy(blk.Wd[:, : p.H, : p.I])

    def silu(v):
        return v / (1 + np.exp(-v))

    def softmax(v):
        z = np.exp(v - v.max())
        return z / z.sum()

    out, chosen = np.zeros_like(X), []
    for t in range(X.shape[0]):
        logit = Wr @ X[t]
        if p.router == "softmax_topk":
            prob = softmax(logit)
            ch = np.argsort(-prob, kind="stable")[: p.k]
            w = prob[ch] / (prob[ch].sum() if p.norm else 1.0)
        else:
            ch = np.argsort(-logit, kind="stable")[: p.k]
            w = softmax(logit[ch])
        chosen.append([int(c) for c in ch])
        for wj, e in zip(w, ch, strict=True):
            out[t] += wj * (D[e] @ (silu(G[e] @ X[t]) * (U[e] @ X[t])))
    if p.Is:
        sg = npy(blk.Wsgu[: p.Is, : p.H])
        su = npy(blk.Wsgu[blk.Isp : blk.Isp + p.Is, : p.H])
        sd = npy(blk.Wsd[: p.H, : p.Is])
        sy = (silu(X @ sg.T) * (X @ su.T)) @ sd.T
        if p.gated:
            sy = sy / (1 + np.exp(-(X @ npy(blk.Wsgate[:, : p.H]).T)))
        out += sy
    return out, chosen


def run_smoke(args) -> int:
    """Tiny shapes on the CPU in f32: both implementations (group_align 1 and 4) against
    the numpy reference, weight-byte bookkeeping, then the benchmark/JSON path."""
    device, dtype = torch.device("cpu"), torch.float32
    fails = 0
    for p in SMOKE_PRESETS.values():
        blk = Block(p, device, dtype, args.seed)
        for t in (1, 3, 7, 16):
            x = make_x(blk, t, args.seed)
            ref, chosen = reference_numpy(blk, x)
            reft = torch.from_numpy(ref.astype("float32"))
            for label, out in (
                ("eager", moe_eager(blk, x)),
                ("grouped_mm", moe_grouped(blk, x, 1)),
                ("grouped_mm align=4", moe_grouped(blk, x, 4)),
            ):
                e = nmse(out, reft)
                ok = tuple(out.shape) == (t, p.H) and e <= SMOKE_NMSE_MAX
                fails += not ok
                print(f"{p.name:<20} T={t:<3} {label:<19} NMSE vs numpy {e:.2e} {'ok' if ok else 'FAIL'}")
            _, ids = route(blk, x)
            union = {e for c in chosen for e in c}
            want = blk.elt * (p.E * p.H + len(union) * 3 * p.H * p.I + 3 * p.H * p.Is + (p.H if p.gated else 0))
            same_sets = [sorted(r) for r in ids.tolist()] == [sorted(c) for c in chosen]
            ok = blk.weight_bytes(ids) == want and same_sets
            fails += not ok
            print(f"{p.name:<20} T={t:<3} routing sets + weight_bytes {'ok' if ok else 'FAIL'}")
    # The benchmark path end to end (plain mode, CPU timer, JSON).
    args.tokens, args.repeats, args.warmup, args.validate_tokens = [1, 5], 3, 1, 0
    ctx = measure_context(device, Timer(device), 1 / 64, 64)
    ctx["device"] = "cpu (smoke)"
    reports = [bench_preset(p, args, device, dtype, Timer(device), ctx) for p in SMOKE_PRESETS.values()]
    for r in reports:
        fails += not r["validation"]["pass"] or bool(r["errors"])
        fails += len(r["cases"]) != len(args.tokens) * len(args.impl)
    write_json(args.json, reports)
    print(f"\nsmoke: {'ok' if not fails else f'{fails} FAILED'}")
    return 1 if fails else 0


# ----------------------------------------------------------------------------- main


def write_json(path, reports) -> None:
    """One preset: moekit's report object (+ extra fields); several: a list of them."""
    if path:
        with open(path, "w") as f:
            json.dump(reports[0] if len(reports) == 1 else reports, f, indent=2)
        print(f"wrote {path}")


def _csv(s: str):
    return [v.strip() for v in s.split(",") if v.strip()]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="all", help=f"comma list or 'all': {', '.join(PRESETS)}")
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,512", help="token counts T per MoE call")
    ap.add_argument("--impl", default="eager,grouped_mm", help="comma list of eager, grouped_mm")
    ap.add_argument("--modes", default="plain,graph", help="plain and/or graph (CUDA graph; grouped_mm only)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None, help="write the results here (moekit's schema + extra fields)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=50, help="timed calls per case (median reported)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--group-align", type=int, default=1, help="pad each expert's rows to a multiple (grouped_mm)")
    ap.add_argument("--launch-tokens", default="1", help="T values whose launches are counted; 'none' or 'all'")
    ap.add_argument("--validate-tokens", type=int, default=0, help="T of the numerics check (default: largest)")
    ap.add_argument("--flush-l2", action="store_true", help="overwrite 256 MiB before each timed call")
    ap.add_argument("--bw-gib", type=float, default=2.0, help="size of the read-bandwidth buffer")
    ap.add_argument("--gemm-n", type=int, default=8192)
    ap.add_argument("--smoke", action="store_true", help="tiny CPU self-test (numpy stand-in if no torch)")
    a = ap.parse_args(argv)
    a.tokens = [int(v) for v in _csv(a.tokens)]
    a.impl, a.modes = _csv(a.impl), _csv(a.modes)
    a.presets = list(PRESETS) if a.preset == "all" else _csv(a.preset)
    bad = [n for n in a.presets if n not in PRESETS] + [i for i in a.impl if i not in ("eager", "grouped_mm")]
    bad += [m for m in a.modes if m not in ("plain", "graph")]
    if bad or not a.tokens or min(a.tokens) < 1 or a.group_align < 1 or a.repeats < 1:
        ap.error(f"bad arguments {bad or ''}; presets: {', '.join(PRESETS)}")
    lt = a.launch_tokens.strip()
    a.launch_tokens = [] if lt == "none" else a.tokens if lt == "all" else [int(v) for v in _csv(lt)]
    return a


def load_torch(smoke: bool) -> None:
    global torch, F
    try:
        import torch as _t
        import torch.nn.functional as _f
    except ImportError:
        if not smoke:
            raise
        _t = _NumpyTorch()
        _f = _t.nn.functional
        print("torch not installed: --smoke runs on the numpy stand-in")
    torch, F = _t, _f


def main(argv=None) -> int:
    args = parse_args(argv)
    load_torch(args.smoke)
    with torch.inference_mode():
        if args.smoke:
            return run_smoke(args)
        device = torch.device(args.device)
        if device.type == "cuda":
            device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
            torch.cuda.set_device(device)
            name = f"{device} ({torch.cuda.get_device_name(device)})"
        else:
            name = f"cpu ({torch.get_num_threads()} threads)"
        timer = Timer(device, 256 << 20 if args.flush_l2 else 0)
        print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), device {name}; measuring context...")
        ctx = measure_context(device, timer, args.bw_gib, args.gemm_n)
        ctx.update(device=name, torch_version=torch.__version__, cuda_version=torch.version.cuda)
        ctx["flush_l2"] = bool(args.flush_l2)
        print(
            f"read bandwidth {ctx['read_bw_gb_per_s']:.1f} GB/s (torch.sum), copy {ctx['copy_gb_per_s']:.1f} GB/s"
            f" (read+write), bf16 GEMM {ctx['gemm_bf16_tflop_per_s']:.1f} TFLOP/s"
        )
        dtype = torch.bfloat16
        reports = [bench_preset(PRESETS[n], args, device, dtype, timer, ctx) for n in args.presets]
        if args.launch_tokens and device.type == "cuda":
            print("\nlaunch counts (torch.profiler, one call):")
            for r in reports:
                add_launches(r, PRESETS[r["preset"]], args, device, dtype)
    write_json(args.json, reports)
    bad = [r["preset"] for r in reports if not r["validation"]["pass"] or r["errors"]]
    if bad:
        print(f"problems in: {', '.join(bad)} (see 'validation' / 'errors')")
    return 1 if bad else 0


# ----------------------------------------------------------------------------- numpy stand-in


class _NumpyTorch:
    """The few torch calls this script makes, on numpy (f32 math; bf16 is an alias of
    f32). Only for --smoke on a machine without torch: it checks the bookkeeping of
    routing, sort/offsets, permute, padding and combine, not torch's kernels."""

    def __init__(self):
        import numpy as np

        self.np = np
        self.__version__ = "numpy-stand-in"
        self.float32 = self.bfloat16 = np.dtype(np.float32)
        self.int64, self.int32, self.bool = np.dtype(np.int64), np.dtype(np.int32), np.dtype(bool)
        self.version = argparse.Namespace(cuda=None)
        self.cuda = argparse.Namespace(is_available=lambda: False)
        T = self.Tensor = _make_np_tensor(np)
        w = T._w
        nt = self

        class Gen:
            def __init__(self, device=None):
                self.rng = np.random.default_rng(0)

            def manual_seed(self, s):
                self.rng = np.random.default_rng(s)
                return self

        self.Generator = Gen
        self.nn = argparse.Namespace(
            functional=argparse.Namespace(
                linear=lambda x, W: w(x.a @ W.a.T),
                silu=lambda x: w(x.a / (1 + np.exp(-x.a))),
                one_hot=lambda t, num_classes: w((t.a[..., None] == np.arange(num_classes)).astype(np.int64)),
                pad=lambda x, pd: w(np.pad(x.a, [(0, 0)] * (x.a.ndim - 1) + [tuple(pd)])),
            )
        )
        self.device = lambda s, i=None: argparse.Namespace(type=str(s).split(":")[0], index=i)
        self.inference_mode = contextlib.nullcontext
        self.get_num_threads = lambda: 1
        self.from_numpy = lambda a: w(a)
        self.zeros = lambda s, dtype=None, device=None: w(np.zeros(s, dtype or nt.float32))
        self.empty = self.zeros
        self.zeros_like = self.empty_like = lambda t: w(np.zeros_like(t.a))
        self.arange = lambda n, device=None, dtype=None: w(np.arange(n, dtype=dtype or np.int64))
        self.randn = lambda s, generator=None, device=None, dtype=None: w(
            (generator or Gen()).rng.standard_normal(s).astype(dtype or nt.float32)
        )
        self.rand = lambda s, generator=None, device=None, dtype=None: w(
            (generator or Gen()).rng.random(s).astype(dtype or nt.float32)
        )
        self.sigmoid = lambda t: w(1 / (1 + np.exp(-t.a)))
        self.bmm = lambda a, b: w(a.a @ b.a)
        self.cat = lambda ts, dim=0: w(np.concatenate([t.a for t in ts], axis=dim))
        self.cumsum = lambda t, dim: w(np.cumsum(t.a, axis=dim))
        self.diff = lambda t, prepend: w(np.diff(t.a, prepend=prepend.a))
        self.where = lambda c: tuple(w(i.astype(np.int64)) for i in np.nonzero(c.a))

    def softmax(self, t, dim):
        z = self.np.exp(t.a - t.a.max(axis=dim, keepdims=True))
        return self.Tensor._w(z / z.sum(axis=dim, keepdims=True))

    def topk(self, t, k, dim=-1):
        np = self.np
        idx = np.argsort(-t.a, axis=dim, kind="stable")[..., :k]
        return self.Tensor._w(np.take_along_axis(t.a, idx, axis=dim)), self.Tensor._w(idx.astype(np.int64))

    def sort(self, t, stable=True):
        idx = self.np.argsort(t.a, kind="stable")
        return self.Tensor._w(t.a[idx]), self.Tensor._w(idx.astype(self.np.int64))

    def searchsorted(self, seq, v, right=False, out_int32=False):
        r = self.np.searchsorted(seq.a, v.a, side="right" if right else "left")
        return self.Tensor._w(r.astype(self.np.int32 if out_int32 else self.np.int64))


def _make_np_tensor(np):
    def un(v):
        return v.a if isinstance(v, T) else tuple(un(i) for i in v) if isinstance(v, tuple) else v

    def op(f):
        return lambda s, o: T(f(s.a, un(o)))

    class T:
        is_cuda, device = False, "cpu"

        def __init__(self, a):
            self.a = np.asarray(a)

        _w = staticmethod(lambda a: T(a))
        shape = property(lambda s: tuple(s.a.shape))
        dtype = property(lambda s: s.a.dtype)
        element_size = lambda s: s.a.itemsize  # noqa: E731
        float = lambda s: T(s.a.astype(np.float32))  # noqa: E731
        long = lambda s: T(s.a.astype(np.int64))  # noqa: E731
        to = lambda s, dtype: T(s.a.astype(dtype))  # noqa: E731
        detach = cpu = contiguous = lambda s: s  # noqa: E731
        numpy = lambda s: s.a  # noqa: E731
        tolist = lambda s: s.a.tolist()  # noqa: E731
        item = lambda s: s.a.item()  # noqa: E731
        reshape = view = lambda s, *shape: T(s.a.reshape(*shape))  # noqa: E731
        flatten = lambda s: T(s.a.reshape(-1))  # noqa: E731
        unsqueeze = lambda s, d: T(np.expand_dims(s.a, d))  # noqa: E731
        squeeze = lambda s, d: T(np.squeeze(s.a, d))  # noqa: E731
        permute = lambda s, *d: T(s.a.transpose(d))  # noqa: E731
        transpose = lambda s, i, j: T(np.swapaxes(s.a, i, j))  # noqa: E731
        sum = lambda s, dim=None, keepdim=False: T(s.a.sum(axis=dim, keepdims=keepdim))  # noqa: E731
        nonzero = lambda s: T(np.argwhere(s.a).astype(np.int64))  # noqa: E731
        new_zeros = new_empty = lambda s, shape: T(np.zeros(shape, s.a.dtype))  # noqa: E731
        index_select = lambda s, dim, idx: T(np.take(s.a, idx.a, axis=dim))  # noqa: E731
        __getitem__ = lambda s, i: T(s.a[un(i)])  # noqa: E731

        def __setitem__(self, i, v):
            self.a[un(i)] = un(v)

        def mul_(self, v):
            self.a *= un(v)
            return self

        def uniform_(self, lo, hi):
            self.a[...] = np.random.default_rng(0).uniform(lo, hi, self.a.shape)
            return self

        def copy_(self, src):
            self.a[...] = src.a
            return self

        def index_copy_(self, dim, idx, src):
            assert dim == 0
            self.a[idx.a] = src.a
            return self

        def index_add_(self, dim, idx, src):
            assert dim == 0
            np.add.at(self.a, idx.a, src.a)
            return self

        __add__ = __radd__ = op(np.add)
        __sub__ = op(np.subtract)
        __mul__ = __rmul__ = op(np.multiply)
        __truediv__ = op(np.true_divide)
        __floordiv__ = op(np.floor_divide)
        __pow__ = op(np.power)
        __gt__ = op(np.greater)
        __matmul__ = op(np.matmul)

    return T


if __name__ == "__main__":
    sys.exit(main())

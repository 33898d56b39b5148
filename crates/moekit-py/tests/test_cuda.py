"""The Python binding on CUDA with PyTorch: run on the GPU machine only
(`python3 -m pytest crates/moekit-py/tests/test_cuda.py`); CI runs
test_cpu.py. Without torch or a GPU this module fails to import: it never
passes by skipping.

Checks: bit-identity with the Rust path (the CLI, `MOEKIT_CLI`, default
gpu-bundle/moekit) on the same input, agreement with the CPU oracle, the
stream contract (moekit's work is ordered on the caller's current stream),
capture and replay in `torch.cuda.graph`, in-place outputs, `fused_experts`
and `route` on torch tensors, and errors as exceptions.
"""

import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch

import moekit

assert torch.cuda.is_available(), "test_cuda.py needs a CUDA GPU and PyTorch built with CUDA"

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIX = ROOT / "fixtures" / "gguf"
DEV = torch.device("cuda", 0)


def nmse(got, want):
    got = torch.as_tensor(got).double().cpu()
    want = torch.as_tensor(want).double().cpu()
    return float(((got - want) ** 2).sum() / (want**2).sum().clamp_min(1e-300))


def cli():
    exe = os.environ.get("MOEKIT_CLI") or str(ROOT / "gpu-bundle" / "moekit")
    assert os.path.exists(exe), f"the moekit CLI is not at {exe} (set MOEKIT_CLI)"
    return exe


CASES = [("qwen3moe_kquant", 0), ("deepseek2_v3", 1), ("qwen2moe_q4_0", 0), ("qwen3next_fused_q8_0", 0)]


@pytest.mark.parametrize("name,layer", CASES)
def test_bf16_layer_is_bit_identical_to_the_rust_path(tmp_path, name, layer):
    x = FIX / f"{name}_x.npy"
    out = tmp_path / "y.npy"
    subprocess.run(
        [cli(), "run", "--model", str(FIX / f"{name}.gguf"), "--layer", str(layer), "--input", str(x),
         "--output", str(out), "--device", "cuda", "--dtype", "bf16"],
        check=True, capture_output=True,
    )
    want = torch.from_numpy(np.load(out))
    lay = moekit.open(FIX / f"{name}.gguf").moe_layer(layer, device="cuda")
    xt = torch.from_numpy(np.load(x)).to(DEV, torch.bfloat16)
    y = lay(xt)
    assert isinstance(y, torch.Tensor) and y.device == xt.device and y.dtype == torch.bfloat16
    assert torch.equal(y.float().cpu(), want)
    # The CPU oracle on the same (bf16-rounded) input, in f32.
    ref = moekit.open(FIX / f"{name}.gguf").moe_layer(layer)(xt.float().cpu().numpy())
    assert nmse(y.float(), ref) < 1e-3


def qwen3_like(fmt="affine4-g64", e=32, h=512, i=256, k=4):
    parts = (moekit.Experts.random("f32", (1, e, h), seed=1).to("cuda"),
             moekit.Experts.random(fmt, (e, i, h), seed=2).to("cuda"),
             moekit.Experts.random(fmt, (e, i, h), seed=3).to("cuda"),
             moekit.Experts.random(fmt, (e, h, i), seed=4).to("cuda"))
    return moekit.Layer.from_parts(*parts, k, rule="softmax_topk", norm_topk_prob=True)


@pytest.mark.parametrize("t", [1, 8, 200])
def test_in_place_out_equals_a_new_output_on_every_path(t):
    lay = qwen3_like()
    x = torch.randn(t, lay.hidden, device=DEV, dtype=torch.bfloat16)
    for path in ("auto", "general", "decode", "tensor_core"):
        if path == "decode" and t > 64:
            continue
        out = torch.full_like(x, float("nan"))
        r = lay(x, out=out, path=path)
        assert r is out
        fresh = lay._native.forward(x, None, torch.cuda.current_stream().cuda_stream, path)
        assert torch.equal(out, torch.from_dlpack(fresh)), path


def test_runs_on_the_callers_stream():
    lay = qwen3_like()
    x_true = torch.randn(8, lay.hidden, device=DEV, dtype=torch.bfloat16)
    want = lay(x_true)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device=DEV)
    with torch.cuda.stream(s):
        x = torch.zeros_like(x_true)
        for _ in range(20):  # keep s busy for milliseconds before x is written
            big = big @ big * 1e-3
        x.copy_(x_true)
        y = lay(x)           # must wait for the copy: it runs on s
        z = y * 1.0          # and y must be complete before this
    torch.cuda.synchronize()
    assert torch.equal(y, want) and torch.equal(z, want)


@pytest.mark.parametrize("t", [1, 8, 100])
def test_capture_in_a_torch_cuda_graph_and_replay(t):
    lay = qwen3_like()
    x = torch.randn(t, lay.hidden, device=DEV, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            lay(x, out=out)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lay(x, out=out)
    for seed in range(3):
        new = torch.randn(t, lay.hidden, device=DEV, dtype=torch.bfloat16, generator=torch.Generator(DEV).manual_seed(seed))
        x.copy_(new)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, lay(new)), seed


def torch_reference(x, w13, w2, topk_w, topk_ids):
    """f32 reference of vLLM's fused_experts from dense [E, 2I, H] / [E, H, I] weights."""
    x = x.float()
    i = w13.shape[1] // 2
    y = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[t, j])
            gu = w13[e].float() @ x[t]
            y[t] += topk_w[t, j] * (w2[e].float() @ (torch.nn.functional.silu(gu[:i]) * gu[i:]))
    return y


def test_fused_experts_on_torch_tensors():
    e, h, i, k, t = 16, 256, 128, 4, 12
    g = torch.Generator(DEV).manual_seed(0)
    w13 = (torch.randn(e, 2 * i, h, device=DEV, generator=g) * h**-0.5).to(torch.bfloat16)
    w2 = (torch.randn(e, h, i, device=DEV, generator=g) * i**-0.5).to(torch.bfloat16)
    x = torch.randn(t, h, device=DEV, generator=g).to(torch.bfloat16)
    logits = torch.randn(t, e, device=DEV, generator=g)
    topk_w, topk_ids = moekit.route(logits, k, rule="softmax_topk")
    assert topk_ids.dtype == torch.int32 and topk_w.dtype == torch.float32 and topk_ids.is_cuda
    # The CPU route of the same logits chooses the same experts.
    cw, cids = moekit.route(logits.cpu().numpy(), k, rule="softmax_topk")
    assert np.array_equal(np.sort(topk_ids.cpu().numpy(), 1), np.sort(cids, 1))
    ref = torch_reference(x, w13, w2, topk_w, topk_ids)
    # Dense torch weights, used in place.
    y = moekit.fused_experts(x, w13, w2, topk_w, topk_ids)
    assert y.dtype == torch.bfloat16 and nmse(y.float(), ref) < 1e-4
    # moekit-quantized weights (Q8_0 gate/up, affine8 down) against their own dequantization.
    q13 = moekit.quantize(w13.float().cpu().numpy(), "q8_0").to("cuda")
    q2 = moekit.quantize(w2.float().cpu().numpy(), "affine8-g64").to("cuda")
    d13 = torch.from_dlpack(q13.dequantize()).to(DEV)
    d2 = torch.from_dlpack(q2.dequantize()).to(DEV)
    yq = moekit.fused_experts(x, q13, q2, topk_w, topk_ids)
    assert nmse(yq.float(), torch_reference(x, d13, d2, topk_w, topk_ids)) < 1e-4
    # inplace=True writes hidden_states.
    x2 = x.clone()
    r = moekit.fused_experts(x2, w13, w2, topk_w, topk_ids, inplace=True)
    assert r is x2 and torch.equal(x2, y)


def test_errors_on_cuda_are_exceptions():
    lay = qwen3_like()
    h = lay.hidden
    with pytest.raises(moekit.MoekitError, match="cuda:0"):
        lay(torch.zeros(2, h, dtype=torch.bfloat16))  # CPU tensor, CUDA layer
    with pytest.raises(ValueError, match="non-contiguous"):
        lay(torch.zeros(h, 2, device=DEV, dtype=torch.bfloat16).t())
    flat = torch.zeros(2 * h + 1, device=DEV, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="aligned"):
        lay(flat[1:].view(2, h))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        lay(torch.zeros(2, h, device=DEV, dtype=torch.int64))
    with pytest.raises(moekit.MoekitError, match="out"):
        lay(torch.zeros(2, h, device=DEV, dtype=torch.bfloat16), out=torch.zeros(2, h, device=DEV))
    # An expert id out of range: rows skipped (no out-of-bounds write), reported.
    e = lay.n_experts
    x = torch.randn(3, h, device=DEV, dtype=torch.bfloat16)
    w13 = torch.randn(e, 2 * 256, h, device=DEV, dtype=torch.bfloat16)
    w2 = torch.randn(e, h, 256, device=DEV, dtype=torch.bfloat16)
    ids = torch.full((3, 2), e, device=DEV, dtype=torch.int32)
    moekit.fused_experts(x, w13, w2, torch.ones(3, 2, device=DEV), ids)
    torch.cuda.synchronize()
    with pytest.raises(moekit.MoekitError, match="expert id"):
        moekit.check_cuda_errors(0)
    moekit.check_cuda_errors(0)  # cleared

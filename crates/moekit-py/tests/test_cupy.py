"""The binding with CuPy arrays on CUDA (GPU machine, by hand: needs
`cupy-cuda13x` and PyTorch; not in CI). Without CuPy this module fails to
import: it never passes by skipping.

CuPy has no bfloat16: float16 and float32 activations. Results are compared
bit for bit with the same layer called on torch tensors of the same values
(same path, same stream order)."""

import pathlib

import cupy
import numpy as np
import torch

import moekit

FIX = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "gguf"


def test_layer_takes_and_returns_cupy_arrays_on_its_current_stream():
    lay = moekit.open(FIX / "qwen3moe_kquant.gguf").moe_layer(0, device="cuda")
    x = np.load(FIX / "qwen3moe_kquant_x.npy").astype(np.float16)
    want = lay(torch.from_numpy(x).cuda()).cpu().numpy()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        xc = cupy.asarray(x)
        y = lay(xc)
        assert isinstance(y, cupy.ndarray) and y.dtype == np.float16 and y.shape == x.shape
        out = cupy.empty_like(xc)
        assert lay(xc, out=out) is out
    s.synchronize()
    assert np.array_equal(cupy.asnumpy(y), want)
    assert np.array_equal(cupy.asnumpy(out), want)


def test_fused_experts_and_route_on_cupy_arrays():
    e, h, i, k, t = 8, 256, 128, 2, 5
    rng = np.random.default_rng(0)
    w13 = (rng.standard_normal((e, 2 * i, h)) * h**-0.5).astype(np.float32)
    w2 = (rng.standard_normal((e, h, i)) * i**-0.5).astype(np.float32)
    x = rng.standard_normal((t, h)).astype(np.float32)
    logits = rng.standard_normal((t, e)).astype(np.float32)
    w, ids = moekit.route(cupy.asarray(logits), k)
    assert isinstance(ids, cupy.ndarray) and ids.dtype == np.int32
    y = moekit.fused_experts(cupy.asarray(x), cupy.asarray(w13), cupy.asarray(w2), w, ids)
    tw, tids = moekit.route(torch.from_numpy(logits).cuda(), k)
    ty = moekit.fused_experts(torch.from_numpy(x).cuda(), torch.from_numpy(w13).cuda(),
                              torch.from_numpy(w2).cuda(), tw, tids)
    assert np.array_equal(cupy.asnumpy(ids), tids.cpu().numpy())
    assert np.array_equal(cupy.asnumpy(y), ty.cpu().numpy())

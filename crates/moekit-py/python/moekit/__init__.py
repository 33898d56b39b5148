"""moekit: the MoE layers of quantized LLMs (GGUF, MLX, Hugging Face
checkpoints) on the CPU and CUDA, on tensors of any framework that speaks
DLPack (NumPy, PyTorch, CuPy, JAX), without copies.

    import moekit, torch
    ck = moekit.open("Qwen3-30B-A3B-Q4_K_M.gguf")
    layer = ck.moe_layer(ck.moe_layers[0], device="cuda")
    x = torch.randn(8, layer.hidden, device="cuda", dtype=torch.bfloat16)
    y = layer(x)                      # a torch tensor, [8, hidden]

Results come back in the input's framework: a NumPy array for NumPy input,
a torch tensor for torch input (CuPy likewise; other frameworks get a
`moekit.Array`, which any DLPack consumer takes). Outputs are allocated by
the input's framework (so PyTorch's caching allocator and CUDA graphs own
them) and written in place. On CUDA, moekit runs on the caller's current
stream (`torch.cuda.current_stream()`, CuPy's current stream), so it is
ordered with the caller's work and can be captured in `torch.cuda.graph`
(warm up once outside the capture: the first call compiles kernels).

Errors raise `moekit.MoekitError` (a ValueError) with moekit's message;
wrong device, dtype, shape or a non-contiguous tensor raise, never crash.
Data errors that CUDA kernels find (an expert id out of range) skip the
rows and are reported by `check_cuda_errors()`, which synchronizes.
"""

from . import _moekit
from ._moekit import Array, Experts, MoekitError, __version__, cuda_available

__all__ = [
    "Array",
    "Checkpoint",
    "Experts",
    "Layer",
    "MoekitError",
    "check_cuda_errors",
    "cuda_available",
    "fused_experts",
    "open",
    "quantize",
    "route",
]


def _framework(x):
    return type(x).__module__.split(".")[0]


def _stream(x):
    """The raw handle of the caller's current CUDA stream for x's device, or None."""
    fw = _framework(x)
    if fw == "torch" and x.is_cuda:
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    if fw == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return None


def _empty(like, shape, dtype=None):
    """An uninitialized array of like's framework and device, or None."""
    if shape is None:
        return None
    fw = _framework(like)
    if fw == "torch":
        import torch

        return torch.empty(shape, dtype=dtype or like.dtype, device=like.device)
    if fw == "numpy":
        import numpy as np

        return np.empty(shape, dtype=dtype or like.dtype)
    if fw == "cupy":
        import cupy

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, dtype=dtype or like.dtype)
    return None


def _shape(x):
    s = getattr(x, "shape", None)
    return None if s is None else tuple(s)


def _wrap(arr, like):
    """A moekit.Array as a tensor of like's framework (zero-copy)."""
    fw = _framework(like)
    if fw == "torch":
        import torch

        return torch.from_dlpack(arr)
    if fw == "numpy":
        import numpy as np

        return np.from_dlpack(arr)
    if fw == "cupy":
        import cupy

        return cupy.from_dlpack(arr)
    if fw in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return jnp.from_dlpack(arr)
    return arr


def check_cuda_errors(device=0):
    """Waits for moekit's work on CUDA device `device` (its own stream) and
    raises MoekitError if a kernel reported a data error since the last check."""
    _moekit._check_cuda_errors(device)


class Layer:
    """One MoE layer (router, routed experts, shared expert) on a device.

    `layer(x)` runs it on `x [T, hidden]`; see `Checkpoint.moe_layer`."""

    def __init__(self, native):
        self._native = native

    def __call__(self, x, out=None, path="auto"):
        """y = layer(x): `x [T, hidden]` float32/float16/bfloat16 on the
        layer's device. `out`: write into this `[T, hidden]` tensor of x's
        dtype (returned). `path`: force `general`, `decode` or `tensor_core`."""
        s = _stream(x)
        if out is None:
            out = _empty(x, _shape(x))
            if out is None:
                return _wrap(self._native.forward(x, None, s, path), x)
        self._native.forward(x, out, s, path)
        return out

    @staticmethod
    def from_parts(router, gate, up, down, top_k, rule="softmax_topk", norm_topk_prob=True, bias=None,
                   n_group=1, topk_group=1, routed_scaling_factor=1.0, per_expert_scale=None,
                   dropped_groups="zero"):
        """A layer from moekit.Experts: router [1, E, H], gate and up [E, I, H]
        (or a fused gate_up [E, 2I, H] as `gate` with up=None), down [E, H, I];
        routing as in `moekit.route`."""
        return Layer(_moekit.Layer.from_parts(
            router, gate, up, down, top_k, rule, norm_topk_prob,
            None if bias is None else [float(b) for b in bias], n_group, topk_group,
            float(routed_scaling_factor),
            None if per_expert_scale is None else [float(s) for s in per_expert_scale],
            dropped_groups=str(dropped_groups)))

    def forward_with_routing(self, x):
        """(y, topk_weights float32 [T, k], topk_ids int32 [T, k])."""
        y, w, i = self._native.forward_with_routing(x, _stream(x))
        return _wrap(y, x), _wrap(w, x), _wrap(i, x)

    def plan(self, tokens, dtype="bfloat16"):
        """(path, [(refused path, reason), ...]) for `tokens` rows of `dtype`."""
        return self._native.plan(tokens, str(dtype))

    def __getattr__(self, name):
        # hidden, n_experts, top_k, intermediate, device, formats
        return getattr(self._native, name)

    def __repr__(self):
        return repr(self._native)


class Checkpoint:
    """A GGUF file or safetensors directory (memory-mapped)."""

    def __init__(self, native):
        self._native = native

    def moe_layer(self, layer, device="cpu", dtype=None):
        """The MoE layer of transformer block `layer` on `device` ("cpu",
        "cuda", "cuda:N"); `dtype` converts dense expert weights."""
        return Layer(self._native.moe_layer(layer, device, None if dtype is None else str(dtype)))

    @property
    def moe_layers(self):
        return self._native.moe_layers

    @property
    def summary(self):
        return self._native.summary

    def tensors(self):
        return self._native.tensors()

    def __repr__(self):
        return repr(self._native)


def open(path):
    """Opens a `.gguf` file or a safetensors directory."""
    import os

    return Checkpoint(_moekit.open(os.fspath(path)))


def route(logits, top_k, rule="softmax_topk", norm_topk_prob=True, bias=None, n_group=1,
          topk_group=1, routed_scaling_factor=1.0, per_expert_scale=None, dropped_groups="zero"):
    """(topk_weights float32 [T, k], topk_ids int32 [T, k]) for router logits
    [T, E], in logits' framework. Rules: softmax_topk, topk_softmax, gemma4,
    grouped_softmax, grouped_sigmoid (see the native docstring). Grouped rules:
    `dropped_groups` = "zero" (mlx-lm: the experts of dropped groups get key 0
    and stay selectable) or "neg_inf" (llama.cpp: never selected)."""
    w, i = _moekit.route(logits, top_k, rule, norm_topk_prob,
                         None if bias is None else [float(b) for b in bias], n_group, topk_group,
                         float(routed_scaling_factor),
                         None if per_expert_scale is None else [float(s) for s in per_expert_scale],
                         _stream(logits), dropped_groups=str(dropped_groups))
    return _wrap(w, logits), _wrap(i, logits)


def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, activation="silu",
                  out=None):
    """vLLM's fused_experts: Σ_j topk_weights[t, j] · w2_e(silu(gate) · up) with
    [gate; up] = w1_e · x_t and e = topk_ids[t, j] (slot order, deterministic).

    w1 [E, 2I, H] and w2 [E, H, I]: moekit.Experts in any format (from
    moekit.quantize or Experts.from_parts) or float tensors. topk_weights
    float32 [T, k], topk_ids int32 [T, k]. `inplace` writes hidden_states."""
    if activation != "silu":
        raise MoekitError(f"fused_experts: activation {activation!r} (only 'silu' is supported)")
    if inplace:
        out = hidden_states
    s = _stream(hidden_states)
    if out is None:
        out = _empty(hidden_states, _shape(hidden_states))
        if out is None:
            return _wrap(_moekit.fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, None, s),
                         hidden_states)
    _moekit.fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, out, s)
    return out


def quantize(w, format, scale_dtype="bfloat16"):
    """Float weights [E, N, K] (or [N, K]) on the CPU → moekit.Experts in `format`
    (MLX affine "affine4-g64" …, GGUF "q4_0"/"q4_1"/"q5_0"/"q5_1"/"q8_0", dense)."""
    return _moekit.quantize(w, format, str(scale_dtype))

"""The binding with JAX arrays on the CPU (needs `pip install jax`; not in
CI, which installs no JAX: run by hand, `python3 -m pytest
crates/moekit-py/tests/test_jax.py`). Without JAX this module fails to
import: it never passes by skipping.

JAX arrays are immutable, so outputs are moekit's own, handed over through
DLPack (`jnp.from_dlpack`)."""

import pathlib

import jax.numpy as jnp
import numpy as np

import moekit

FIX = pathlib.Path(__file__).resolve().parents[3] / "fixtures"


def test_layer_takes_and_returns_jax_arrays():
    lay = moekit.open(FIX / "gguf" / "qwen3moe_kquant.gguf").moe_layer(0)
    x = np.load(FIX / "gguf" / "qwen3moe_kquant_x.npy")
    y = lay(jnp.asarray(x))
    assert type(y).__module__.split(".")[0] in ("jax", "jaxlib"), type(y)
    assert np.array_equal(np.asarray(y), lay(x))


def test_route_and_fused_experts_on_jax_arrays():
    d = FIX / "moe" / "qwen3_moe_f32"
    f = {p.stem: np.load(p) for p in d.glob("*.npy")}
    w13 = np.concatenate([f["switch_mlp.gate_proj.weight"], f["switch_mlp.up_proj.weight"]], axis=1)
    y = moekit.fused_experts(jnp.asarray(f["x"]), jnp.asarray(w13), jnp.asarray(f["switch_mlp.down_proj.weight"]),
                             jnp.asarray(f["weights"]), jnp.asarray(f["ids"]))
    want = moekit.fused_experts(f["x"], w13, f["switch_mlp.down_proj.weight"], f["weights"], f["ids"])
    assert np.array_equal(np.asarray(y), want)
    w, ids = moekit.route(jnp.asarray(f["x"] @ f["gate.weight"].T), 2)
    assert ids.shape == (f["x"].shape[0], 2) and str(ids.dtype) == "int32"

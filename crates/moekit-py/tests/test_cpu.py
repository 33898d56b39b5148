"""The Python binding on the CPU with NumPy (CI runs these; no PyTorch or GPU).

References are independent of moekit: the committed fixtures' outputs of
llama.cpp's `build_moe_ffn` transcribed to numpy (GGUF files), mlx-lm's MoE
block classes (`fixtures/moe`), mx.quantize (`fixtures/affine`,
`fixtures/mlxfp`), gguf-py
(`fixtures/ggml`) and the routing references (`fixtures/route`). The Rust
path is the CLI (`moekit run`), for bit-identity of the binding.
"""

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

import moekit

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIX = ROOT / "fixtures"


def nmse(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    return float(((got - want) ** 2).sum() / max((want**2).sum(), 1e-300))


def gguf_cases():
    cases = []
    for out in sorted((FIX / "gguf").glob("*_out_*.npy")):
        name, layer = out.stem.rsplit("_out_", 1)
        cases.append((name, int(layer)))
    return cases


@pytest.mark.parametrize("name,layer", gguf_cases())
def test_layer_matches_the_llama_cpp_reference(name, layer):
    ck = moekit.open(FIX / "gguf" / f"{name}.gguf")
    lay = ck.moe_layer(layer)
    x = np.load(FIX / "gguf" / f"{name}_x.npy")
    y = lay(x)
    assert isinstance(y, np.ndarray) and y.shape == x.shape and y.dtype == np.float32
    want = np.load(FIX / "gguf" / f"{name}_out_{layer}.npy")
    # The default CPU path quantizes activations to 8 bits for most formats:
    # the Rust suite's bound for it (tests/gguf_load.rs).
    assert nmse(y, want) <= 1e-4, (name, nmse(y, want))


def cli():
    exe = os.environ.get("MOEKIT_CLI") or str(ROOT / "target" / "debug" / "moekit")
    if not os.path.exists(exe):
        pytest.fail(f"the moekit CLI is not built at {exe}: run `cargo build -p moekit-cli` or set MOEKIT_CLI")
    return exe


@pytest.mark.parametrize("name,layer", [("qwen3moe_kquant", 0), ("deepseek2_v3", 1), ("qwen2moe_q4_0", 0)])
def test_layer_is_bit_identical_to_the_rust_path(tmp_path, name, layer):
    x = FIX / "gguf" / f"{name}_x.npy"
    out = tmp_path / "y.npy"
    subprocess.run(
        [cli(), "run", "--model", str(FIX / "gguf" / f"{name}.gguf"), "--layer", str(layer),
         "--input", str(x), "--output", str(out), "--device", "cpu"],
        check=True, capture_output=True,
    )
    want = np.load(out)
    got = moekit.open(FIX / "gguf" / f"{name}.gguf").moe_layer(layer)(np.load(x))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_out_is_written_in_place_and_returned():
    lay = moekit.open(FIX / "gguf" / "qwen3moe_f32.gguf").moe_layer(0)
    x = np.load(FIX / "gguf" / "qwen3moe_f32_x.npy")
    out = np.full_like(x, np.nan)
    r = lay(x, out=out)
    assert r is out
    assert np.array_equal(out, lay(x))
    # float16 in, float16 out, same framework.
    y16 = lay(x.astype(np.float16))
    assert y16.dtype == np.float16 and nmse(y16, out) < 1e-5


def test_forward_with_routing_and_plan():
    lay = moekit.open(FIX / "gguf" / "qwen3moe_f32.gguf").moe_layer(0)
    x = np.load(FIX / "gguf" / "qwen3moe_f32_x.npy")
    y, w, ids = lay.forward_with_routing(x)
    assert np.array_equal(y, lay(x))
    assert w.shape == ids.shape == (x.shape[0], lay.top_k) and ids.dtype == np.int32
    assert ((ids >= 0) & (ids < lay.n_experts)).all()
    path, refused = lay.plan(4, "float32")
    assert path == "General" and {p for p, _ in refused} == {"Decode", "TensorCore"}


def test_errors_are_exceptions_with_moekit_messages():
    lay = moekit.open(FIX / "gguf" / "qwen3moe_f32.gguf").moe_layer(0)
    h = lay.hidden
    with pytest.raises(moekit.MoekitError, match=r"\[T, 256\]|256"):
        lay(np.zeros((2, h + 1), np.float32))
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        lay(np.zeros((2, h), np.int64))
    with pytest.raises(ValueError, match="non-contiguous"):
        lay(np.zeros((2, 2 * h), np.float32)[:, ::2])
    with pytest.raises(TypeError, match="DLPack"):
        lay([[0.0] * h])
    with pytest.raises(moekit.MoekitError, match="out"):
        lay(np.zeros((2, h), np.float32), out=np.zeros((3, h), np.float32))
    ro = np.zeros((2, h), np.float32)
    ro.setflags(write=False)
    with pytest.raises((ValueError, BufferError), match="read-only|readonly"):
        lay(np.zeros((2, h), np.float32), out=ro)
    with pytest.raises(moekit.MoekitError, match="path"):
        lay(np.zeros((2, h), np.float32), path="fast")
    with pytest.raises(moekit.MoekitError):
        moekit.open(FIX / "gguf" / "does_not_exist.gguf")
    with pytest.raises(moekit.MoekitError, match="device"):
        moekit.open(FIX / "gguf" / "qwen3moe_f32.gguf").moe_layer(0, device="tpu")
    with pytest.raises(moekit.MoekitError):
        moekit.open(FIX / "gguf" / "qwen3moe_f32.gguf").moe_layer(7)


def route_cases():
    return json.loads((FIX / "route" / "cases.json").read_text())


@pytest.mark.parametrize("case", route_cases(), ids=lambda c: c["name"])
def test_route_matches_the_reference_routing(case):
    name = case["name"]
    logits = np.load(FIX / "route" / f"{name}_logits.npy")
    rule = case["kind"]
    if rule == "grouped":
        rule = "grouped_" + case["scoring"]
    w, ids = moekit.route(
        logits, case["top_k"], rule=rule, norm_topk_prob=case.get("norm_topk_prob", True),
        bias=case.get("bias"), n_group=case.get("n_group", 1), topk_group=case.get("topk_group", 1),
        routed_scaling_factor=case.get("routed_scaling_factor", 1.0),
        per_expert_scale=case.get("per_expert_scale"),
        dropped_groups=case.get("dropped_groups", "zero"),
    )
    want_ids = np.load(FIX / "route" / f"{name}_ids.npy")
    want_w = np.load(FIX / "route" / f"{name}_weights.npy")
    rows = [r for r in range(logits.shape[0]) if r not in case["tie_rows"]]
    # Compare as expert → weight maps: the references' slot order may differ.
    for r in rows:
        got = dict(zip(ids[r].tolist(), w[r].tolist()))
        want = dict(zip(want_ids[r].tolist(), want_w[r].tolist()))
        assert got.keys() == want.keys(), (name, r)
        for e in want:
            assert abs(got[e] - want[e]) <= 1e-5 * max(1.0, abs(want[e])), (name, r, e)


@pytest.mark.parametrize("case", [c for c in route_cases() if c.get("dropped_groups") == "neg_inf"],
                         ids=lambda c: c["name"])
def test_route_dropped_groups_zero_and_neg_inf(case):
    # The llama.cpp cases (-inf masking of dropped groups) with the other rule, "zero"
    # (mlx-lm, the default): the fixture's _zero_ids, differing on the listed rows.
    name = case["name"]
    logits = np.load(FIX / "route" / f"{name}_logits.npy")
    kw = dict(rule="grouped_sigmoid", norm_topk_prob=case["norm_topk_prob"], bias=case["bias"],
              n_group=case["n_group"], topk_group=case["topk_group"],
              routed_scaling_factor=case["routed_scaling_factor"])
    ids = {m: np.sort(np.asarray(moekit.route(logits, case["top_k"], dropped_groups=m, **kw)[1]), axis=1)
           for m in ("zero", "neg_inf")}
    default = np.sort(np.asarray(moekit.route(logits, case["top_k"], **kw)[1]), axis=1)
    np.testing.assert_array_equal(ids["neg_inf"], np.load(FIX / "route" / f"{name}_ids.npy"))
    np.testing.assert_array_equal(ids["zero"], np.load(FIX / "route" / f"{name}_zero_ids.npy"))
    np.testing.assert_array_equal(default, ids["zero"])
    differ = [r for r in range(logits.shape[0]) if not np.array_equal(ids["zero"][r], ids["neg_inf"][r])]
    assert differ == case["differ_rows"] and differ, name
    with pytest.raises(moekit.MoekitError, match="dropped_groups"):
        moekit.route(logits, case["top_k"], dropped_groups="nan", **kw)


def test_route_rejects_bad_rules():
    with pytest.raises(moekit.MoekitError, match="rule"):
        moekit.route(np.zeros((1, 8), np.float32), 2, rule="argmax")
    with pytest.raises(moekit.MoekitError, match="per_expert_scale"):
        moekit.route(np.zeros((1, 8), np.float32), 2, rule="gemma4")
    with pytest.raises(moekit.MoekitError, match="top_k"):
        moekit.route(np.zeros((1, 8), np.float32), 9)


def load_moe(case):
    d = FIX / "moe" / case
    return {p.stem: np.load(p) for p in d.glob("*.npy")}, json.loads((d / "config.json").read_text())


def test_fused_experts_with_dense_numpy_weights_matches_mlx_lm():
    f, _ = load_moe("qwen3_moe_f32")
    w13 = np.concatenate([f["switch_mlp.gate_proj.weight"], f["switch_mlp.up_proj.weight"]], axis=1)
    y = moekit.fused_experts(f["x"], w13, f["switch_mlp.down_proj.weight"], f["weights"], f["ids"])
    assert isinstance(y, np.ndarray) and nmse(y, f["out"]) <= 1e-10


def test_fused_experts_with_mlx_affine_weights_matches_mlx_lm():
    f, _ = load_moe("qwen3_moe_q4_g64")
    e, i, _ = f["switch_mlp.gate_proj.weight"].shape
    h = f["x"].shape[1]
    cat = lambda s: np.ascontiguousarray(  # noqa: E731
        np.concatenate([f[f"switch_mlp.gate_proj.{s}"], f[f"switch_mlp.up_proj.{s}"]], axis=1))
    w13 = moekit.Experts.from_parts("affine4-g64", (e, 2 * i, h), cat("weight"), cat("scales"), cat("biases"))
    w2 = moekit.Experts.from_parts("affine4-g64", (e, h, i), f["switch_mlp.down_proj.weight"],
                                   f["switch_mlp.down_proj.scales"], f["switch_mlp.down_proj.biases"])
    assert w13.format == "affine4-g64" and w13.shape == (e, 2 * i, h)
    out = np.empty_like(f["x"])
    r = moekit.fused_experts(f["x"], w13, w2, f["weights"], f["ids"], out=out)
    assert r is out and nmse(out, f["out"]) <= 1e-4
    # Out-of-range ids are an error, never an out-of-bounds write.
    bad = f["ids"].copy()
    bad[0, 0] = e
    with pytest.raises(moekit.MoekitError):
        moekit.fused_experts(f["x"], w13, w2, f["weights"], bad)


def test_quantize_is_bit_exact_with_mx_quantize():
    a = FIX / "affine"
    w = np.load(a / "q_b4_g64_w_f32.npy")
    q = moekit.quantize(w, "affine4-g64", scale_dtype="float32")
    data, scales, biases = q.parts()
    assert np.array_equal(np.from_dlpack(data).ravel(), np.load(a / "q_b4_g64_f32_wq.npy").ravel())
    assert np.array_equal(np.from_dlpack(scales).ravel(), np.load(a / "q_b4_g64_f32_scales.npy").ravel())
    assert np.array_equal(np.from_dlpack(biases).ravel(), np.load(a / "q_b4_g64_f32_biases.npy").ravel())
    deq = np.from_dlpack(q.dequantize())
    assert np.array_equal(deq.ravel(), np.load(a / "q_b4_g64_f32_deq.npy").ravel())


@pytest.mark.parametrize("mode", ["mxfp4", "nvfp4", "mxfp8"])
@pytest.mark.parametrize("case", ["q", "qe"])
def test_quantize_mlx_fp_modes_is_byte_exact_with_mx_quantize(mode, case):
    # `q`: random weights, `qe`: edge cases (NaN, inf, subnormals, ties, ...).
    m = FIX / "mlxfp"
    w = np.load(m / f"{mode}_{case}_x.npy")
    q = moekit.quantize(w, f"mlx-{mode}")
    data, scales, biases = q.parts()
    assert biases is None
    want_w, want_s = np.load(m / f"{mode}_{case}_w.npy"), np.load(m / f"{mode}_{case}_scales.npy")
    got_w, got_s = np.from_dlpack(data), np.from_dlpack(scales)
    assert got_w.dtype == np.uint32 and got_s.dtype == np.uint8
    assert np.array_equal(got_w.reshape(want_w.shape), want_w)
    assert np.array_equal(got_s.reshape(want_s.shape), want_s)
    if case == "q":
        deq = np.from_dlpack(q.dequantize()).reshape(w.shape)
        assert np.array_equal(deq, np.load(m / f"{mode}_q_deq.npy"))
    with pytest.raises(moekit.MoekitError, match="cols"):
        moekit.quantize(np.ascontiguousarray(w[:, :16]), f"mlx-{mode}")


@pytest.mark.parametrize("ty", ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"])
def test_quantize_ggml_is_byte_exact_with_gguf_py(ty):
    g = FIX / "ggml"
    src = np.load(g / f"{ty}_qsrc.npy")
    q = moekit.quantize(src.reshape(1, -1), ty)
    data, scales, biases = q.parts()
    assert scales is None and biases is None
    assert np.array_equal(np.from_dlpack(data).ravel(), np.load(g / f"{ty}_qout.npy").ravel())


def test_quantize_refuses_formats_without_a_quantizer():
    with pytest.raises(moekit.MoekitError, match="q4_k"):
        moekit.quantize(np.zeros((4, 256), np.float32), "q4_k")
    with pytest.raises(moekit.MoekitError, match="iq4_xs"):
        moekit.quantize(np.zeros((4, 256), np.float32), "iq4_xs")


def test_arrays_export_through_dlpack():
    q = moekit.quantize(np.ones((2, 4, 64), np.float32), "f32")
    data, _, _ = q.parts()
    assert data.shape == [2, 4, 64] and data.dtype == "float32" and data.device == "cpu"
    assert data.__dlpack_device__() == (1, 0)
    assert np.array_equal(np.from_dlpack(data), np.ones((2, 4, 64), np.float32))


def test_cuda_available_says_why_not():
    n, why = moekit.cuda_available()
    assert (n > 0) == (why is None)


def test_layer_from_parts_matches_the_mlx_lm_block():
    f, cfg = load_moe("qwen3_moe_q4_g64")
    e, i, _ = f["switch_mlp.gate_proj.weight"].shape
    h = f["x"].shape[1]

    def ex(prefix, fmt, shape):
        return moekit.Experts.from_parts(fmt, shape, f[f"{prefix}.weight"], f[f"{prefix}.scales"],
                                         f[f"{prefix}.biases"])

    lay = moekit.Layer.from_parts(
        ex("gate", "affine8-g64", (1, e, h)),
        ex("switch_mlp.gate_proj", "affine4-g64", (e, i, h)),
        ex("switch_mlp.up_proj", "affine4-g64", (e, i, h)),
        ex("switch_mlp.down_proj", "affine4-g64", (e, h, i)),
        cfg["top_k"], rule="softmax_topk", norm_topk_prob=cfg["norm_topk_prob"],
    )
    y, w, ids = lay.forward_with_routing(f["x"])
    assert nmse(y, f["out"]) <= 1e-4
    assert np.array_equal(np.sort(ids, axis=1), np.sort(f["ids"], axis=1))


def test_random_experts_layer_agrees_with_fused_experts_on_its_routing():
    e, h, i, k = 8, 128, 64, 2
    router = moekit.Experts.random("f32", (1, e, h), seed=1)
    gate = moekit.Experts.random("q4_0", (e, i, h), seed=2)
    up = moekit.Experts.random("q4_0", (e, i, h), seed=3)
    down = moekit.Experts.random("q8_0", (e, h, i), seed=4)
    lay = moekit.Layer.from_parts(router, gate, up, down, k, rule="topk_softmax")
    x = np.random.default_rng(5).standard_normal((6, h)).astype(np.float32)
    y, w, ids = lay.forward_with_routing(x)
    # gate and up fused into one [E, 2I, H] holder give the same experts.
    w13 = moekit.Experts.from_parts("q4_0", (e, 2 * i, h), np.concatenate(
        [np.from_dlpack(gate.parts()[0]), np.from_dlpack(up.parts()[0])], axis=1))
    y2 = moekit.fused_experts(x, w13, down, w, ids)
    assert np.array_equal(y, y2)
    with pytest.raises(moekit.MoekitError, match="down"):
        moekit.Layer.from_parts(router, gate, up, moekit.Experts.random("q8_0", (e, h, 2 * i)), k)

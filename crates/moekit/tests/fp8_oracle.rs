//! FP8 block-scaled weights (`WeightFormat::Fp8Block`, Hugging Face
//! `quant_method: "fp8"`) against scripts/fixtures/fp8.py's oracles:
//! * fixtures/fp8: every e4m3 byte (NaN codes included) times block scales
//!   with ragged edges, dequantized as transformers' / DeepSeek's
//!   `weight_dequant` in numpy + ml_dtypes: bit for bit;
//! * fixtures/st/deepseek_v3_hf_fp8: a tiny DeepSeek-V3 checkpoint in the
//!   official FP8 layout; the MoE block matches mlx-lm's
//!   `model.layers[1].mlp(x)` on the dequantized f32 weights;
//! * bad configs and tensors give errors that name the key or tensor.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common_util;
use common_util::{fixture, nmse};
use moekit::cpu::{with_act_mode, ActMode};
use moekit::format::fp8;
use moekit::load::safetensors::open;
use moekit::load::Checkpoint;
use moekit::npy::NpyArray;
use moekit::ops::act::GateUp;
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// mlx-lm computes in f32 on the same dequantized values; only the
/// summation order differs.
const NMSE_BOUND: f64 = 1e-10;

fn npy(path: &Path) -> NpyArray {
    NpyArray::read(path).unwrap()
}

fn bytes_of(a: &NpyArray) -> Vec<u8> {
    let t = a.to_tensor().unwrap();
    assert_eq!(t.dtype(), DType::U8);
    t.as_slice::<u8>().unwrap().to_vec()
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn dequantization_matches_the_numpy_oracle_bit_for_bit() {
    for (case, n, k, group) in [("ragged", 136, 160, 32), ("full", 130, 256, 128)] {
        let dir = fixture("fp8");
        let codes = bytes_of(&npy(&dir.join(format!("{case}_w.npy"))));
        assert_eq!(&codes[..256], (0..=255u8).collect::<Vec<_>>().as_slice());
        let scale_inv = npy(&dir.join(format!("{case}_scale_inv.npy")))
            .to_f32()
            .unwrap();
        let rows_want = npy(&dir.join(format!("{case}_scales_rows.npy")))
            .to_f32()
            .unwrap();
        let deq = npy(&dir.join(format!("{case}_deq.npy"))).to_f32().unwrap();
        assert_eq!(fp8::row_group(k, 128), Some(group));
        let rows = fp8::expand_scales(&scale_inv, n, k, (128, 128), group).unwrap();
        assert_eq!(rows.len(), rows_want.len(), "{case}");
        assert!(
            rows.iter().zip(&rows_want).all(|(a, b)| same(*a, *b)),
            "{case}: expanded scales"
        );
        let w = QuantWeights::new(
            WeightFormat::Fp8Block { block_k: group },
            1,
            n,
            k,
            Tensor::from_slice(&codes, &[1, n, k]).unwrap(),
            Some(Tensor::from_slice(&rows, &[1, n, k / group]).unwrap()),
            None,
        )
        .unwrap();
        let got = w.dequantize_expert(0).unwrap();
        let bad = got
            .iter()
            .zip(&deq)
            .filter(|(a, b)| !same(**a, **b))
            .count();
        assert_eq!(bad, 0, "{case}: {bad} weights differ from the oracle");
        assert!(
            got[0x7F].is_nan() && got[0xFF].is_nan(),
            "{case}: NaN codes"
        );
    }
}

#[test]
fn format_names_shapes_and_argument_errors() {
    for b in [32, 64, 128] {
        let f = WeightFormat::Fp8Block { block_k: b };
        assert_eq!(WeightFormat::parse(&f.to_string()).unwrap(), f);
        assert!(WeightFormat::all().contains(&f));
    }
    assert_eq!(
        WeightFormat::parse("fp8").unwrap(),
        WeightFormat::Fp8Block { block_k: 128 }
    );
    for bad in ["fp8-b16", "fp8-b96", "fp8-b", "fp8-bx"] {
        let e = WeightFormat::parse(bad).unwrap_err().to_string();
        assert!(
            e.contains("block_k") || e.contains("fp8-b128"),
            "{bad}: {e}"
        );
    }
    let f = WeightFormat::Fp8Block { block_k: 128 };
    let (d, s, sc) = moekit::format::storage_shapes(f, 2, 3, 256).unwrap();
    assert_eq!(
        (d, s, sc),
        (DType::U8, vec![2, 3, 256], Some(vec![2, 3, 2]))
    );
    assert!(moekit::format::storage_shapes(f, 2, 3, 160).is_err());
    let codes = Tensor::from_slice(&[0u8; 3 * 256], &[1, 3, 256]).unwrap();
    // u8 scales (MLX fp's) are not FP8 block scales.
    let e = QuantWeights::new(
        f,
        1,
        3,
        256,
        codes.clone(),
        Some(Tensor::from_slice(&[0u8; 6], &[1, 3, 2]).unwrap()),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("f32"), "{e}");
    let e = QuantWeights::new(f, 1, 3, 256, codes, None, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("scales"), "{e}");
}

fn case_dir() -> PathBuf {
    fixture("st/deepseek_v3_hf_fp8")
}

#[test]
fn deepseek_v3_fp8_checkpoint_matches_mlx_lm() {
    let ck = open(&case_dir()).unwrap();
    let s = ck.summary();
    assert_eq!(
        (s.n_experts, s.top_k, s.hidden, s.intermediate),
        (6, 2, 128, 160)
    );
    let listed = ck.tensors();
    let w = listed
        .iter()
        .find(|t| t.name == "model.layers.1.mlp.experts.0.gate_proj.weight")
        .unwrap();
    assert_eq!(w.format, "fp8-128x128");
    let block = ck.moe_block(1, &|_, _| {}).unwrap();
    let p = block.parts();
    let b128 = WeightFormat::Fp8Block { block_k: 128 };
    let b32 = WeightFormat::Fp8Block { block_k: 32 };
    let GateUp::Separate { gate, up } = &p.gate_up else {
        panic!("separate gate/up expected");
    };
    assert_eq!(
        (gate.format(), up.format(), p.down.format()),
        (b128, b128, b32)
    );
    // The router stays bf16 (DeepSeek-V3 does not quantize `mlp.gate`).
    assert_eq!(p.router_weight.format(), WeightFormat::Dense(DType::Bf16));
    let sh = p.shared.as_ref().unwrap();
    assert_eq!(sh.down.format(), b32);
    // Row 150 of expert 3's gate is in the partial second row block.
    let scales = gate.scales().unwrap().to_f32_vec().unwrap();
    assert_eq!(scales.len(), 6 * 160);
    assert_ne!(scales[3 * 160 + 150], scales[3 * 160 + 10]);

    let x = npy(&case_dir().join("x.npy")).to_tensor().unwrap();
    let want = npy(&case_dir().join("out.npy")).to_f32().unwrap();
    for b in [Backend::CpuReference, Backend::CpuFast] {
        let got = with_act_mode(ActMode::F32, || block.forward_on(b, &x))
            .unwrap()
            .out
            .to_f32_vec()
            .unwrap();
        let e = nmse(&got, &want);
        println!("deepseek_v3_hf_fp8 {b:?}: NMSE {e:.2e}");
        assert!(e <= NMSE_BOUND, "{b:?}: NMSE {e:e} > {NMSE_BOUND:e}");
    }
}

/// A copy of the fixture checkpoint in a temporary directory.
struct TempCase(PathBuf);

impl TempCase {
    fn new(tag: &str) -> TempCase {
        let d = std::env::temp_dir().join(format!("moekit_fp8_{tag}_{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        for f in ["config.json", "model.safetensors"] {
            fs::copy(case_dir().join(f), d.join(f)).unwrap();
        }
        TempCase(d)
    }
    fn edit_config(&self, edit: impl FnOnce(&mut Value)) {
        let p = self.0.join("config.json");
        let mut v: Value = serde_json::from_str(&fs::read_to_string(&p).unwrap()).unwrap();
        edit(&mut v);
        fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
    /// Edits the safetensors header (the data stays where it is).
    fn edit_header(&self, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
        let p = self.0.join("model.safetensors");
        let bytes = fs::read(&p).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut h: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        edit(h.as_object_mut().unwrap());
        let mut text = serde_json::to_vec(&h).unwrap();
        assert!(text.len() <= n, "edited header grew");
        text.resize(n, b' ');
        let mut out = bytes[..8].to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(&bytes[8 + n..]);
        fs::write(&p, out).unwrap();
    }
    fn block_err(&self) -> String {
        match open(&self.0) {
            Err(e) => e.to_string(),
            Ok(ck) => ck
                .moe_block(1, &|_, _| {})
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default(),
        }
    }
}

impl Drop for TempCase {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const SI: &str = "model.layers.1.mlp.experts.2.down_proj.weight_scale_inv";

#[test]
fn bad_fp8_checkpoints_name_the_key_or_tensor() {
    // A scale tensor of the wrong shape: named, with the shape found and expected.
    let t = TempCase::new("shape");
    t.edit_header(|h| h[SI]["shape"] = serde_json::json!([2, 1]));
    let e = t.block_err();
    assert!(
        e.contains(SI) && e.contains("[2, 1]") && e.contains("[1, 2]"),
        "{e}"
    );

    // Block scales without the config saying fp8.
    let t = TempCase::new("nocfg");
    t.edit_config(|v| {
        v.as_object_mut().unwrap().remove("quantization_config");
    });
    let e = t.block_err();
    assert!(
        e.contains("weight_scale_inv") && e.contains("quant_method"),
        "{e}"
    );

    // Config values other than the supported ones name the key.
    for (key, val, want) in [
        ("fmt", serde_json::json!("e5m2"), "quantization_config.fmt"),
        (
            "activation_scheme",
            serde_json::json!("static"),
            "quantization_config.activation_scheme",
        ),
        (
            "weight_block_size",
            serde_json::json!([128, 48]),
            "quantization_config.weight_block_size",
        ),
    ] {
        let t = TempCase::new(key);
        t.edit_config(|v| v["quantization_config"][key] = val);
        let e = t.block_err();
        assert!(e.contains(want), "{key}: {e}");
    }

    // A block size the stored scales do not fit: the scale tensor is named.
    let t = TempCase::new("block");
    t.edit_config(|v| v["quantization_config"]["weight_block_size"] = serde_json::json!([64, 64]));
    let e = t.block_err();
    assert!(
        e.contains("weight_scale_inv") && e.contains("[64, 64]"),
        "{e}"
    );

    // An FP8 weight whose scales are missing.
    let t = TempCase::new("noscale");
    t.edit_header(|h| {
        let v = h.remove(SI).unwrap();
        h.insert(SI.replace("_scale_inv", "_scale"), v);
    });
    let e = t.block_err();
    assert!(e.contains("F8_E4M3") && e.contains(SI), "{e}");

    // Scales beside a weight that is not FP8.
    let t = TempCase::new("dtype");
    t.edit_header(|h| {
        let w = "model.layers.1.mlp.experts.2.down_proj.weight";
        h[w]["dtype"] = serde_json::json!("U8");
    });
    let e = t.block_err();
    assert!(e.contains("expected F8_E4M3"), "{e}");
}

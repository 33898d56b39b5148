//! Safetensors checkpoint directories (fixtures/st, made by
//! scripts/fixtures/st_models.py with mlx-lm's own model classes, `save_model`
//! and the `safetensors` package): the summary matches the mlx-lm model, the
//! MoE block matches mlx-lm's `model.layers[N].mlp(x)`, and bad or mutated
//! checkpoints give errors, never panics.

#![allow(clippy::unwrap_used)] // a failed unwrap is a failed test

mod common_util;
use common_util::{fixture, nmse, rng};
use moekit::cpu::{with_act_mode, ActMode};
use moekit::load::safetensors::{open, SafetensorsCheckpoint};
use moekit::load::Checkpoint;
use moekit::npy::NpyArray;
use moekit::tensor::Storage;
use moekit::{Backend, Bytes, Error};
use rand::Rng;
use serde_json::Value;
use std::cell::Cell;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// mlx-lm runs the block in f32 (weights widened exactly from bf16/f16; the
/// quantized ones dequantized the same way); ours differs only in summation
/// order, so NMSE ≤ 1e-8 (measured values are printed: ~1e-14), with the
/// fast CPU path's f32 activations (`ActMode::F32`).
const NMSE_BOUND: f64 = 1e-8;
/// With the fast CPU path's default activations (8-bit blocks for the
/// formats with integer kernels): NMSE ≤ 1e-4.
const NMSE_Q8: f64 = 1e-4;

const CASES: [&str; 40] = [
    "qwen3_moe_mlx_q4",
    "qwen3_moe_hf_sharded",
    "qwen2_moe_mlx_q4",
    "qwen3_next_mlx_q4",
    "mixtral_hf",
    "mixtral_mlx_q4",
    "olmoe_hf_f16",
    "deepseek_v2_hf",
    "deepseek_v3_mlx_q4",
    "glm4_moe_mlx_q8_g32",
    "qwen3_moe_mlx_mxfp4",
    "mixtral_mlx_nvfp4",
    "qwen2_moe_mlx_mxfp8",
    "qwen3_5_moe_mlx_q4",
    "qwen3_5_moe_hf_fused",
    "kimi_k25_mlx_q4",
    "kimi_k2_hf",
    "minimax_m2_mlx_q8_g32",
    "minimax_m2_hf",
    "granitemoe_mlx_q4",
    "granitemoe_hf_fused",
    "dots1_mlx_q4",
    "dots1_hf",
    "gpt_oss_mlx_q4",
    "gpt_oss_mlx_mxfp4",
    "gpt_oss_unquantized",
    "gpt_oss_hf_mxfp4",
    "bailing_moe_mlx_q4",
    "bailing_moe_hf",
    "gemma4_text_mlx_q4",
    "gemma4_hf_fused",
    "llama4_mlx_q4",
    "llama4_hf_transposed",
    "ernie4_5_moe_mlx_q4",
    "ernie4_5_moe_hf_bias",
    "hunyuan_mlx_q4",
    "hunyuan_hf",
    "gpt_oss_hf_bf16",
    "qwen2_moe_mlx_nvfp4_gs",
    "gpt_oss_mlx_nvfp4_gs",
];

fn case_dir(name: &str) -> PathBuf {
    fixture(&format!("st/{name}"))
}

fn meta(name: &str) -> Value {
    serde_json::from_str(&fs::read_to_string(case_dir(name).join("meta.json")).unwrap()).unwrap()
}

fn usize_of(v: &Value) -> usize {
    v.as_u64().unwrap() as usize
}

/// A fresh copy of a fixture in a temporary directory (removed on drop).
struct TempCase(PathBuf);

impl TempCase {
    fn new(name: &str) -> TempCase {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "moekit_st_{}_{}_{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        for e in fs::read_dir(case_dir(name)).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        TempCase(dir)
    }
    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
    fn edit_json(&self, f: &str, edit: impl FnOnce(&mut Value)) {
        let mut v: Value =
            serde_json::from_str(&fs::read_to_string(self.path(f)).unwrap()).unwrap();
        edit(&mut v);
        fs::write(self.path(f), serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}

impl Drop for TempCase {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Splits a safetensors file into (header JSON, data section).
fn split(bytes: &[u8]) -> (Value, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        bytes[8 + n..].to_vec(),
    )
}

fn join(header: &Value, data: &[u8]) -> Vec<u8> {
    let h = serde_json::to_vec(header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

/// Rewrites the header of a safetensors file, keeping the data.
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let (mut h, data) = split(&fs::read(path).unwrap());
    edit(h.as_object_mut().unwrap());
    fs::write(path, join(&h, &data)).unwrap();
}

fn err_text(r: Result<impl Sized, Error>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

fn block_err(ck: &SafetensorsCheckpoint, layer: usize) -> String {
    err_text(ck.moe_block(layer, &|_, _| {}))
}

#[test]
fn every_fixture_matches_mlx_lm() {
    let mut q8 = Vec::new();
    for name in CASES {
        let m = meta(name);
        let ck = open(&case_dir(name)).unwrap();
        assert_eq!(ck.file_format(), "safetensors");
        let s = ck.summary();
        assert_eq!(s.arch, m["arch"].as_str().unwrap(), "{name}");
        assert_eq!(s.n_layers, usize_of(&m["n_layers"]), "{name}");
        let moe: Vec<usize> = m["moe_layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(usize_of)
            .collect();
        assert_eq!(
            s.moe_layers, moe,
            "{name}: MoE layers vs the mlx-lm model's"
        );
        assert_eq!(
            (s.n_experts, s.top_k, s.hidden, s.intermediate),
            (
                usize_of(&m["n_experts"]),
                usize_of(&m["top_k"]),
                usize_of(&m["hidden"]),
                usize_of(&m["intermediate"])
            ),
            "{name}"
        );
        assert_eq!(
            s.shared.is_some(),
            !m["shared_intermediate"].is_null(),
            "{name}"
        );
        if let Some(sh) = &s.shared {
            assert!(
                sh.contains(&format!(
                    "intermediate {}",
                    usize_of(&m["shared_intermediate"])
                )),
                "{name}: {sh}"
            );
            assert_eq!(
                sh.contains("sigmoid"),
                m["shared_gated"].as_bool().unwrap(),
                "{name}: {sh}"
            );
        }

        let layer = usize_of(&m["layer"]);
        let last = Cell::new((0, 0));
        let calls = Cell::new(0);
        let block = ck
            .moe_block(layer, &|d, t| {
                assert!(d <= t && d > last.get().0, "{name}: progress {d}/{t}");
                last.set((d, t));
                calls.set(calls.get() + 1);
            })
            .unwrap();
        assert_eq!(
            last.get().0,
            last.get().1,
            "{name}: progress must end at total"
        );
        assert_eq!(calls.get(), last.get().1, "{name}");

        let x = NpyArray::read(case_dir(name).join("x.npy"))
            .unwrap()
            .to_tensor()
            .unwrap();
        let want = NpyArray::read(case_dir(name).join("out.npy"))
            .unwrap()
            .to_f32()
            .unwrap();
        for b in [Backend::CpuReference, Backend::CpuFast] {
            let got = with_act_mode(ActMode::F32, || block.forward_on(b, &x))
                .unwrap()
                .out
                .to_f32_vec()
                .unwrap();
            let e = nmse(&got, &want);
            println!("{name:24} {b:?}: NMSE {e:.2e}");
            assert!(e <= NMSE_BOUND, "{name} {b:?}: NMSE {e:e} > {NMSE_BOUND:e}");
        }
        // The default activations: 8-bit blocks for the 4-bit affine experts.
        let got = block
            .forward_on(Backend::CpuFast, &x)
            .unwrap()
            .out
            .to_f32_vec()
            .unwrap();
        let e = nmse(&got, &want);
        println!("{name:24} CpuFast (default activations): NMSE {e:.2e}");
        q8.push((name, e));
    }
    let bad: Vec<_> = q8.iter().filter(|(_, e)| *e > NMSE_Q8).collect();
    assert!(bad.is_empty(), "NMSE > {NMSE_Q8:e}: {bad:?}");
}

/// Rewrites a checkpoint's stacked `switch_mlp` tensors as one tensor per
/// expert (`experts.E.{w1,w3,w2}.{weight,scales,biases}`, the layout of older
/// mlx conversions that mlx-lm's Mixtral `sanitize` restacks).
fn unstack_experts(path: &Path) {
    let (h, data) = split(&fs::read(path).unwrap());
    let mut tensors: Vec<(String, Value)> = h.as_object().unwrap().clone().into_iter().collect();
    tensors.retain(|(k, _)| k != "__metadata__");
    tensors.sort_by_key(|(_, v)| v["data_offsets"][0].as_u64().unwrap());
    let (mut header, mut out) = (serde_json::Map::new(), Vec::new());
    let mut push = |name: String, dtype: &Value, shape: &[Value], bytes: &[u8]| {
        let start = out.len();
        out.extend_from_slice(bytes);
        header.insert(
            name,
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [start, out.len()]}),
        );
    };
    for (name, v) in &tensors {
        let [s, e] = [0, 1].map(|i| v["data_offsets"][i].as_u64().unwrap() as usize);
        let shape = v["shape"].as_array().unwrap();
        match name.split_once(".switch_mlp.") {
            Some((head, tail)) => {
                let (proj, kind) = tail.split_once('.').unwrap();
                let w = match proj {
                    "gate_proj" => "w1",
                    "up_proj" => "w3",
                    _ => "w2",
                };
                let n = shape[0].as_u64().unwrap() as usize;
                let per = (e - s) / n;
                for j in 0..n {
                    push(
                        format!("{head}.experts.{j}.{w}.{kind}"),
                        &v["dtype"],
                        &shape[1..],
                        &data[s + j * per..s + (j + 1) * per],
                    );
                }
            }
            None => push(name.clone(), &v["dtype"], shape, &data[s..e]),
        }
    }
    fs::write(path, join(&Value::Object(header), &out)).unwrap();
}

#[test]
fn per_expert_quantized_layout_matches_stacked() {
    let t = TempCase::new("mixtral_mlx_q4");
    unstack_experts(&t.path("model.safetensors"));
    let ck = open(&t.0).unwrap();
    assert!(ck
        .tensors()
        .iter()
        .any(|e| e.name == "model.layers.1.block_sparse_moe.experts.3.w2.scales"));
    let x = NpyArray::read(t.path("x.npy"))
        .unwrap()
        .to_tensor()
        .unwrap();
    let want = NpyArray::read(t.path("out.npy")).unwrap().to_f32().unwrap();
    let block = ck.moe_block(1, &|_, _| {}).unwrap();
    let got = with_act_mode(ActMode::F32, || block.forward(&x))
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let e = nmse(&got, &want);
    assert!(e <= NMSE_BOUND, "NMSE {e:e}");
}

#[test]
fn tensor_listing_matches_the_files() {
    let ck = open(&case_dir("qwen3_moe_mlx_q4")).unwrap();
    let t = ck.tensors();
    let get = |n: &str| {
        t.iter()
            .find(|e| e.name == n)
            .unwrap_or_else(|| panic!("no {n}"))
    };
    let w = get("model.layers.1.mlp.switch_mlp.gate_proj.weight");
    assert_eq!(
        (w.format.as_str(), w.shape.as_slice(), w.bytes),
        ("u32", &[8usize, 64, 8][..], 8 * 64 * 8 * 4)
    );
    let g = get("model.layers.1.mlp.gate.weight"); // 8-bit router override
    assert_eq!(
        (g.shape.as_slice(), g.format.as_str()),
        (&[8usize, 16][..], "u32")
    );
    assert_eq!(get("model.layers.1.mlp.gate.scales").format, "bf16");
    assert!(
        t.windows(2).all(|p| p[0].name < p[1].name),
        "sorted by name"
    );
    // Sharded: the listing spans both files.
    let sh = open(&case_dir("qwen3_moe_hf_sharded")).unwrap();
    let n = sh
        .tensors()
        .iter()
        .filter(|e| e.name.contains(".mlp.experts."))
        .count();
    assert_eq!(
        n,
        4 * 3,
        "1 MoE layer (mlp_only_layers = [0]) × 4 experts × 3 projections"
    );
}

#[test]
fn zero_copy_where_the_file_allows() {
    // The Hugging Face writer aligns tensors: the router is a view of the map;
    // per-expert tensors are stacked into an owned copy.
    let ck = open(&case_dir("deepseek_v2_hf")).unwrap();
    let b = ck.moe_block(1, &|_, _| {}).unwrap();
    let p = b.parts();
    assert!(matches!(
        p.router_weight.data().storage(),
        Storage::Cpu(Bytes::Shared { .. })
    ));
    assert!(matches!(
        p.down.data().storage(),
        Storage::Cpu(Bytes::Owned { .. })
    ));
    let s = p.shared.as_ref().unwrap();
    assert!(matches!(
        s.down.data().storage(),
        Storage::Cpu(Bytes::Shared { .. })
    ));
}

#[test]
fn dense_and_out_of_range_layers_are_errors() {
    let q = open(&case_dir("qwen3_moe_mlx_q4")).unwrap(); // mlp_only_layers = [0]
    let e = block_err(&q, 0);
    assert!(e.contains("dense") && e.contains("mlp_only_layers"), "{e}");
    let e = block_err(&q, 2);
    assert!(e.contains("layer") && e.contains('2'), "{e}");
    let d = open(&case_dir("deepseek_v3_mlx_q4")).unwrap(); // first_k_dense_replace = 1
    let e = block_err(&d, 0);
    assert!(
        e.contains("dense") && e.contains("first_k_dense_replace"),
        "{e}"
    );
    assert!(block_err(&d, usize::MAX).contains("layer"));
}

#[test]
fn nvfp4_global_scales_are_read_and_misplaced_ones_refused() {
    // The experts' global scales become the block's expert scales,
    // gs / (448 · 6) each (their effect: every_fixture_matches_mlx_lm).
    let m = "model.layers.1.mlp.switch_mlp";
    let ck = open(&case_dir("qwen2_moe_mlx_nvfp4_gs")).unwrap();
    let block = ck.moe_block(1, &|_, _| {}).unwrap();
    let (h, data) =
        split(&fs::read(case_dir("qwen2_moe_mlx_nvfp4_gs").join("model.safetensors")).unwrap());
    let at = &h[format!("{m}.up_proj.global_scale")]["data_offsets"];
    let (a, b) = (
        at[0].as_u64().unwrap() as usize,
        at[1].as_u64().unwrap() as usize,
    );
    let gs: Vec<f32> = data[a..b]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let up = block
        .parts()
        .ffn
        .scale
        .up
        .as_ref()
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let want: Vec<f32> = gs.iter().map(|g| g / 2688.0).collect();
    assert_eq!(up, want);
    assert!(block.parts().ffn.scale.gate.is_some() && block.parts().ffn.scale.down.is_some());

    // A global scale of the wrong shape, beside a module that is not a
    // stacked nvfp4 expert projection (the shared expert), or beside
    // affine weights: refused, naming the tensor.
    let t = TempCase::new("qwen2_moe_mlx_nvfp4_gs");
    let name = format!("{m}.down_proj.global_scale");
    edit_header(&t.path("model.safetensors"), |h| {
        h[&name]["shape"] = serde_json::json!([2, 2]);
    });
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(e.contains(&name) && e.contains("f32 [4]"), "{e}");

    let t = TempCase::new("qwen2_moe_mlx_nvfp4_gs");
    let shared = "model.layers.1.mlp.shared_expert.up_proj.global_scale";
    edit_header(&t.path("model.safetensors"), |h| {
        let v = h.remove(&format!("{m}.up_proj.global_scale")).unwrap();
        h.insert(shared.into(), v);
    });
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(e.contains(shared) && e.contains("stacked expert"), "{e}");

    let t = TempCase::new("qwen2_moe_mlx_q4");
    let gname = format!("{m}.gate_proj.global_scale");
    edit_header(&t.path("model.safetensors"), |h| {
        // Any tensor: the format is refused before it is read.
        let v = h.remove("model.layers.0.input_layernorm.weight").unwrap();
        h.insert(gname.clone(), v);
    });
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(e.contains(&gname) && e.contains("nvfp4"), "{e}");
}

#[test]
fn missing_tensors_name_the_file_and_tensor() {
    let t = TempCase::new("mixtral_mlx_q4");
    let name = "model.layers.1.block_sparse_moe.switch_mlp.down_proj.scales";
    edit_header(&t.path("model.safetensors"), |h| {
        let v = h.remove(name).unwrap();
        h.insert(format!("{name}_renamed"), v);
    });
    let ck = open(&t.0).unwrap();
    let e = block_err(&ck, 1);
    // Without `.scales`, mlx-lm treats the module as unquantized: a u32
    // "dense" weight is rejected, naming the tensor and the file.
    assert!(
        e.contains("down_proj.weight") && e.contains("model.safetensors"),
        "{e}"
    );
    assert!(
        ck.moe_block(0, &|_, _| {}).is_ok(),
        "other layers still load"
    );

    let t = TempCase::new("olmoe_hf_f16");
    let name = "model.layers.1.mlp.experts.3.up_proj.weight";
    edit_header(&t.path("model.safetensors"), |h| {
        let v = h.remove(name).unwrap();
        h.insert("unrelated".into(), v);
    });
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(
        e.contains(name) && e.contains("model.safetensors") && e.contains("missing"),
        "{e}"
    );

    let t = TempCase::new("deepseek_v3_mlx_q4");
    let name = "model.layers.1.mlp.gate.e_score_correction_bias";
    edit_header(&t.path("model.safetensors"), |h| {
        let v = h.remove(name).unwrap();
        h.insert("x".into(), v);
    });
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(e.contains(name), "{e}");
}

#[test]
fn config_errors_are_clear() {
    let t = TempCase::new("qwen3_moe_mlx_q4");
    t.edit_json("config.json", |c| c["model_type"] = "llama".into());
    let e = err_text(open(&t.0));
    let list = moekit::load::family::model_types().join(", ");
    assert!(
        e.contains("`model_type` = \"llama\" is not supported")
            && e.contains(&format!("(supported: {list})"))
            && e.contains("config.json"),
        "{e}"
    );

    let t = TempCase::new("qwen3_moe_mlx_q4");
    t.edit_json("config.json", |c| {
        c.as_object_mut().unwrap().remove("num_experts");
    });
    let e = err_text(open(&t.0));
    assert!(
        e.contains("num_experts") && e.contains("config.json"),
        "{e}"
    );

    // Sizes disagreeing with the tensors: the error names tensor and file.
    let t = TempCase::new("qwen3_moe_mlx_q4");
    t.edit_json("config.json", |c| c["moe_intermediate_size"] = 128.into());
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(
        e.contains("switch_mlp.gate_proj.weight")
            && e.contains("model.safetensors")
            && e.contains("128"),
        "{e}"
    );

    let t = TempCase::new("mixtral_hf");
    t.edit_json("config.json", |c| c["num_local_experts"] = 5.into());
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(e.contains("gate.weight") || e.contains("experts.4"), "{e}");

    // Per-module override `false` on a quantized module, and wrong bits.
    let t = TempCase::new("qwen3_moe_mlx_q4");
    t.edit_json("config.json", |c| {
        c["quantization"]["model.layers.1.mlp.gate"] = false.into()
    });
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(
        e.contains("false") && e.contains("model.layers.1.mlp.gate"),
        "{e}"
    );
    let t = TempCase::new("qwen3_moe_mlx_q4");
    t.edit_json("config.json", |c| {
        c["quantization"]["model.layers.1.mlp.gate"] =
            serde_json::json!({"bits": 4, "group_size": 64})
    });
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(e.contains("model.layers.1.mlp.gate.weight"), "{e}");

    let t = TempCase::new("glm4_moe_mlx_q8_g32");
    t.edit_json("config.json", |c| {
        c["quantization"]["mode"] = "mxfp4".into();
    });
    let e = block_err(&open(&t.0).unwrap(), 1);
    assert!(e.contains("mxfp4"), "{e}");

    let t = TempCase::new("mixtral_hf");
    fs::remove_file(t.path("config.json")).unwrap();
    assert!(err_text(open(&t.0)).contains("config.json"));
    assert!(err_text(open(&case_dir("mixtral_hf").join("x.npy"))).contains("directory"));
}

#[test]
fn shard_index_errors() {
    let t = TempCase::new("qwen3_moe_hf_sharded");
    fs::remove_file(t.path("model-00002-of-00002.safetensors")).unwrap();
    assert!(err_text(open(&t.0)).contains("model-00002-of-00002.safetensors"));

    let t = TempCase::new("qwen3_moe_hf_sharded");
    t.edit_json("model.safetensors.index.json", |i| {
        i["weight_map"]["model.layers.1.mlp.experts.2.up_proj.weight"] =
            "model-00001-of-00002.safetensors".into();
        i["weight_map"]["model.layers.1.mlp.experts.3.up_proj.weight"] =
            "model-00001-of-00002.safetensors".into();
    });
    let e = err_text(open(&t.0));
    assert!(
        e.contains("up_proj.weight") && e.contains("index.json"),
        "{e}"
    );

    let t = TempCase::new("qwen3_moe_hf_sharded");
    t.edit_json("model.safetensors.index.json", |i| {
        i["weight_map"]["model.norm.weight"] = "../../etc/passwd".into()
    });
    assert!(err_text(open(&t.0)).contains("not a file name"));
}

/// One random mutation of the checkpoint; returns what was done.
fn mutate(t: &TempCase, orig_st: &[u8], orig_cfg: &str, r: &mut impl Rng) -> String {
    let st = t.path("model.safetensors");
    let cfg = t.path("config.json");
    fs::write(&st, orig_st).unwrap();
    fs::write(&cfg, orig_cfg).unwrap();
    let n = u64::from_le_bytes(orig_st[..8].try_into().unwrap()) as usize;
    match r.random_range(0..8) {
        0 => {
            let cut = r.random_range(0..orig_st.len());
            fs::write(&st, &orig_st[..cut]).unwrap();
            format!("truncate to {cut}")
        }
        1 => {
            let mut b = orig_st.to_vec();
            let flips = r.random_range(1..4);
            for _ in 0..flips {
                let i = r.random_range(0..8 + n);
                b[i] ^= 1 << r.random_range(0..8);
            }
            fs::write(&st, b).unwrap();
            format!("{flips} header bit flips")
        }
        2 => {
            let mut b = orig_st.to_vec();
            let len: u64 = [
                u64::MAX,
                1 << 40,
                (n as u64) + 1,
                (n as u64).saturating_sub(1),
                0,
                100_000_001,
            ][r.random_range(0..6)];
            b[..8].copy_from_slice(&len.to_le_bytes());
            fs::write(&st, b).unwrap();
            format!("header length {len}")
        }
        3 => {
            let mut b = orig_st.to_vec();
            for _ in 0..8 {
                let i = r.random_range(0..b.len());
                b[i] = r.random();
            }
            fs::write(&st, b).unwrap();
            "random bytes anywhere".into()
        }
        4 => {
            // Structured: a consistent header with one field of one tensor changed.
            let (mut h, data) = split(orig_st);
            let names: Vec<String> = h
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "__metadata__")
                .cloned()
                .collect();
            let name = &names[r.random_range(0..names.len())];
            let info = &mut h[name.as_str()];
            let what = match r.random_range(0..4) {
                0 => {
                    info["dtype"] = ["F32", "BF16", "U8", "I64", "F8_E4M3", "BOOL", "Q4"]
                        [r.random_range(0..7)]
                    .into();
                    "dtype"
                }
                1 => {
                    let s = info["shape"].as_array_mut().unwrap();
                    if !s.is_empty() {
                        let i = r.random_range(0..s.len());
                        s[i] = [0u64, 1, 3, 1 << 33, u64::MAX][r.random_range(0..5)].into();
                    }
                    "shape"
                }
                2 => {
                    let o = info["data_offsets"].as_array_mut().unwrap();
                    o[r.random_range(0..2)] = r.random_range(0..(data.len() as u64 + 64)).into();
                    "offsets"
                }
                _ => {
                    info["shape"] = serde_json::json!([]);
                    "rank"
                }
            };
            fs::write(&st, join(&h, &data)).unwrap();
            format!("tensor {name}: {what}")
        }
        5 => {
            let mut c = orig_cfg.as_bytes().to_vec();
            let i = r.random_range(0..c.len());
            c[i] = r.random_range(32..127);
            fs::write(&cfg, &c).unwrap();
            format!("config byte {i}")
        }
        6 => {
            let cut = r.random_range(0..orig_cfg.len());
            fs::write(&cfg, &orig_cfg[..cut]).unwrap();
            format!("config truncated to {cut}")
        }
        _ => {
            let mut c: Value = serde_json::from_str(orig_cfg).unwrap();
            let keys: Vec<String> = c.as_object().unwrap().keys().cloned().collect();
            let key = keys[r.random_range(0..keys.len())].clone();
            let vals = [
                Value::Null,
                (-1).into(),
                0.into(),
                1.into(),
                3.into(),
                7.into(),
                (1u64 << 62).into(),
                u64::MAX.into(),
                2.5.into(),
                "x".into(),
                true.into(),
                serde_json::json!([1, 2]),
                serde_json::json!({"bits": 3, "group_size": 7}),
                serde_json::json!({"bits": 8}),
            ];
            let v = vals[r.random_range(0..vals.len())].clone();
            c[key.as_str()] = v.clone();
            if let Some(q) = c
                .get_mut("quantization")
                .and_then(Value::as_object_mut)
                .filter(|_| r.random_range(0..4) == 0)
            {
                q.insert("model.layers.1.mlp.switch_mlp.up_proj".into(), v.clone());
            }
            fs::write(&cfg, serde_json::to_string(&c).unwrap()).unwrap();
            format!("config {key} = {v}")
        }
    }
}

/// Runs `rounds` mutations of fixture `name` (layer `layer`); returns
/// (loaded, errors) and fails on any panic.
fn fuzz(name: &str, layer: usize, rounds: usize, seed: u64) -> (usize, usize) {
    let t = TempCase::new(name);
    let orig_st = fs::read(t.path("model.safetensors")).unwrap();
    let orig_cfg = fs::read_to_string(t.path("config.json")).unwrap();
    let x = NpyArray::read(case_dir(name).join("x.npy"))
        .unwrap()
        .to_tensor()
        .unwrap();
    let mut r = rng(seed);
    let (mut ok, mut err) = (0, 0);
    let mut panics = Vec::new();
    for round in 0..rounds {
        let what = mutate(&t, &orig_st, &orig_cfg, &mut r);
        let res =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> Result<(), Error> {
                let ck = open(&t.0)?;
                let _ = ck.tensors();
                let b = ck.moe_block(layer, &|_, _| {})?;
                let y = b.forward(&x)?;
                assert_eq!(y.shape(), x.shape());
                Ok(())
            }));
        match res {
            Ok(Ok(())) => ok += 1,
            Ok(Err(_)) => err += 1,
            Err(_) => panics.push(format!("round {round}: {what}")),
        }
    }
    assert!(panics.is_empty(), "{name}: panics: {panics:#?}");
    // The untouched files still load after all that.
    fs::write(t.path("model.safetensors"), &orig_st).unwrap();
    fs::write(t.path("config.json"), &orig_cfg).unwrap();
    assert!(open(&t.0).unwrap().moe_block(layer, &|_, _| {}).is_ok());
    println!("{name}: {rounds} mutations: {ok} loaded, {err} errors, 0 panics");
    (ok, err)
}

/// 1800 mutations (truncation, bit flips, huge header lengths, consistent
/// headers with one bad field, config.json edits) of an mlx-quantized and a
/// Hugging Face checkpoint: each gives `Err` or a block that runs; no panic.
#[test]
fn fuzzed_checkpoints_give_errors_not_panics() {
    let start = std::time::Instant::now();
    let (ok1, err1) = fuzz("glm4_moe_mlx_q8_g32", 1, 800, 7);
    let (ok2, err2) = fuzz("olmoe_hf_f16", 1, 400, 8);
    // gpt-oss: biases, and OpenAI's interleaved MXFP4 blocks.
    let (ok3, err3) = fuzz("gpt_oss_hf_mxfp4", 1, 400, 9);
    // Llama-4's transposed experts (copied by index) and Gemma-4's norms.
    let (ok4, err4) = fuzz("llama4_hf_transposed", 1, 300, 10);
    let (ok5, err5) = fuzz("gemma4_hf_fused", 1, 300, 11);
    let secs = start.elapsed().as_secs_f64();
    println!("fuzz: {secs:.2} s");
    assert!(
        err1 > 400 && err2 > 200 && err3 > 200 && ok1 > 0 && ok2 > 0 && ok3 > 0,
        "mutations should mostly fail: {ok1}/{err1}, {ok2}/{err2}, {ok3}/{err3}"
    );
    assert!(
        err4 > 150 && err5 > 150 && ok4 > 0 && ok5 > 0,
        "mutations should mostly fail: {ok4}/{err4}, {ok5}/{err5}"
    );
    assert!(secs < 10.0, "fuzz took {secs:.1} s");
}

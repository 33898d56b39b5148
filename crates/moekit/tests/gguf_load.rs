//! GGUF loading against the fixtures of `scripts/fixtures/gguf_models.py`
//! (tiny llama.cpp-named GGUF files written by gguf-py's `GGUFWriter`, and the
//! MoE outputs computed in float64 numpy from `gguf.quants.dequantize`d
//! weights, following llama.cpp's `build_moe_ffn`), plus a fuzz test of the
//! container parser.

#![allow(clippy::unwrap_used)] // test code: a panic is a test failure

mod common_util;

use common_util::{fixture, nmse, rng};
use moekit::cpu::{with_act_mode, ActMode};
use moekit::format::GgmlType;
use moekit::load::gguf::{GgufCheckpoint, GgufFile, SharedBytes, Value};
use moekit::load::Checkpoint;
use moekit::npy::NpyArray;
use moekit::ops::act::GateUp;
use moekit::ops::route::{GroupMask, RouterKind, Scoring};
use moekit::tensor::Storage;
use moekit::{Backend, Bytes, Tensor, WeightFormat};
use rand::Rng;
use serde_json::Value as Json;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

/// Largest accepted NMSE between moekit's f32 forward pass and the float64
/// oracle (same dequantized weights; only f32 rounding differs). The fast
/// CPU backend is run with f32 activations (`ActMode::F32`) for this bound.
const NMSE_MAX: f64 = 1e-8;
/// The same with the fast CPU backend's default activations: 8-bit blocks
/// for the weight formats with integer kernels (llama.cpp's
/// test-backend-ops bound for `mul_mat_id`).
const NMSE_Q8: f64 = 1e-4;

fn manifest() -> Json {
    let text = std::fs::read_to_string(fixture("gguf/manifest.json"))
        .expect("manifest.json (run scripts/gen_fixtures.py --only gguf)");
    serde_json::from_str(&text).expect("manifest.json parses")
}

fn models() -> Vec<Json> {
    manifest()["models"].as_array().expect("models").clone()
}

fn gguf_path(name: &str) -> std::path::PathBuf {
    fixture(&format!("gguf/{name}.gguf"))
}

fn read_bytes(name: &str) -> Vec<u8> {
    std::fs::read(gguf_path(name)).expect("fixture file")
}

fn parse(bytes: Vec<u8>) -> moekit::Result<GgufCheckpoint> {
    GgufCheckpoint::parse(Arc::new(bytes) as SharedBytes, Path::new("in-memory.gguf"))
}

fn input(name: &str) -> Tensor {
    NpyArray::read(fixture(&format!("gguf/{name}_x.npy")))
        .and_then(|a| a.to_tensor())
        .expect("x.npy")
}

fn reference(name: &str, layer: usize) -> Vec<f32> {
    NpyArray::read(fixture(&format!("gguf/{name}_out_{layer}.npy")))
        .and_then(|a| a.to_f32())
        .expect("out.npy")
}

fn usizes(j: &Json) -> Vec<usize> {
    j.as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_u64().expect("uint") as usize)
        .collect()
}

/// Replaces every occurrence of `from` by `to` (same length) in `bytes`; returns the count.
fn replace_all(bytes: &mut [u8], from: &[u8], to: &[u8]) -> usize {
    assert_eq!(from.len(), to.len());
    let mut n = 0;
    let mut i = 0;
    while i + from.len() <= bytes.len() {
        if &bytes[i..i + from.len()] == from {
            bytes[i..i + from.len()].copy_from_slice(to);
            n += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    n
}

/// Byte offset of the ggml type id in the tensor info of `name`.
fn type_id_offset(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend_from_slice(name.as_bytes());
    let at = bytes
        .windows(key.len())
        .position(|w| w == key.as_slice())
        .expect("tensor info");
    let dims_at = at + key.len();
    let n_dims = u32::from_le_bytes(bytes[dims_at..dims_at + 4].try_into().unwrap()) as usize;
    dims_at + 4 + 8 * n_dims
}

#[test]
fn every_fixture_loads_with_the_right_summary() {
    for m in models() {
        let name = m["name"].as_str().unwrap();
        let ck = GgufCheckpoint::open(&gguf_path(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(ck.file_format(), "gguf");
        assert_eq!(ck.file().version(), 3, "{name}");
        let s = ck.summary();
        assert_eq!(s.arch, m["arch"].as_str().unwrap(), "{name}");
        assert_eq!(
            s.n_layers,
            m["n_layers"].as_u64().unwrap() as usize,
            "{name}"
        );
        assert_eq!(s.moe_layers, usizes(&m["moe_layers"]), "{name}");
        assert_eq!(
            s.n_experts,
            m["n_experts"].as_u64().unwrap() as usize,
            "{name}"
        );
        assert_eq!(s.top_k, m["top_k"].as_u64().unwrap() as usize, "{name}");
        assert_eq!(s.hidden, m["hidden"].as_u64().unwrap() as usize, "{name}");
        assert_eq!(
            s.intermediate,
            m["intermediate"].as_u64().unwrap() as usize,
            "{name}"
        );
        match &m["shared"] {
            Json::Null => assert_eq!(s.shared, None, "{name}"),
            sh => {
                let d = s
                    .shared
                    .as_deref()
                    .unwrap_or_else(|| panic!("{name}: no shared expert in summary"));
                assert!(
                    d.contains(&format!("I = {}", sh["intermediate"])),
                    "{name}: {d}"
                );
                assert_eq!(
                    d.contains("sigmoid-gated"),
                    sh["gated"].as_bool().unwrap(),
                    "{name}: {d}"
                );
            }
        }
        assert!(!s.router.is_empty());

        let r = &m["router"];
        for &l in &s.moe_layers {
            let cfg = ck.router_config(l).unwrap();
            assert_eq!((cfg.n_experts, cfg.top_k), (s.n_experts, s.top_k), "{name}");
            let norm = r["norm"].as_bool().unwrap();
            match (r["kind"].as_str().unwrap(), &cfg.kind) {
                ("topk_softmax", RouterKind::TopKSoftmax) => assert!(norm),
                // gemma4.cpp: softmax → top-k → renormalise, × ffn_down_exps.scale.
                ("gemma4", RouterKind::Gemma4 { per_expert_scale }) => {
                    assert!(norm, "{name}");
                    assert_eq!(per_expert_scale.len(), s.n_experts, "{name}");
                    assert!(per_expert_scale.iter().any(|&v| v != 1.0), "{name}");
                }
                ("softmax_topk", RouterKind::SoftmaxTopK { norm_topk_prob }) => {
                    assert_eq!(*norm_topk_prob, norm, "{name}")
                }
                (
                    "grouped",
                    RouterKind::Grouped {
                        scoring,
                        bias,
                        n_group,
                        topk_group,
                        dropped_groups,
                        norm_topk_prob,
                        routed_scaling_factor,
                    },
                ) => {
                    // llama.cpp's masking of dropped groups, for every GGUF family.
                    assert_eq!(*dropped_groups, GroupMask::NegInf, "{name}");
                    assert_eq!(r["dropped_groups"], "neg_inf", "{name}");
                    let want = if r["scoring"] == "sigmoid" {
                        Scoring::Sigmoid
                    } else {
                        Scoring::Softmax
                    };
                    assert_eq!(*scoring, want, "{name}");
                    assert_eq!(bias.is_some(), r["bias"].as_bool().unwrap(), "{name}");
                    assert_eq!(*n_group, r["n_group"].as_u64().unwrap() as usize, "{name}");
                    assert_eq!(
                        *topk_group,
                        r["topk_group"].as_u64().unwrap() as usize,
                        "{name}"
                    );
                    assert_eq!(*norm_topk_prob, norm, "{name}");
                    assert_eq!(
                        *routed_scaling_factor as f64,
                        r["scale"].as_f64().unwrap(),
                        "{name}"
                    );
                }
                (want, got) => panic!("{name}: router {got:?}, want {want}"),
            }
        }

        // The tensor listing: the router of the first MoE block is [E, H].
        let l = s.moe_layers[0];
        let entries = ck.tensors();
        let router = entries
            .iter()
            .find(|t| t.name == format!("blk.{l}.ffn_gate_inp.weight"))
            .expect("router entry");
        assert_eq!(router.shape, vec![s.n_experts, s.hidden], "{name}");
        let bytes_per = match router.format.as_str() {
            "f32" => 4,
            "f16" | "bf16" => 2,
            f => panic!("{name}: router format {f}"),
        };
        assert_eq!(router.bytes, s.n_experts * s.hidden * bytes_per);
    }
}

#[test]
fn every_fixture_matches_the_numpy_oracle() {
    for m in models() {
        let name = m["name"].as_str().unwrap();
        let ck = GgufCheckpoint::open(&gguf_path(name)).unwrap();
        let x = input(name);
        for l in usizes(&m["moe_layers"]) {
            let calls = std::cell::RefCell::new(Vec::new());
            let block = ck
                .moe_block(l, &|d, t| calls.borrow_mut().push((d, t)))
                .unwrap_or_else(|e| panic!("{name} block {l}: {e}"));
            let calls = calls.into_inner();
            let total = calls.last().expect("progress was reported").1;
            assert_eq!(
                calls,
                (1..=total).map(|d| (d, total)).collect::<Vec<_>>(),
                "{name}: progress"
            );
            let want = reference(name, l);
            for backend in [Backend::CpuReference, Backend::CpuFast] {
                let got = with_act_mode(ActMode::F32, || block.forward_on(backend, &x))
                    .unwrap()
                    .out
                    .to_f32_vec()
                    .unwrap();
                let e = nmse(&got, &want);
                println!("{name} block {l} {backend:?}: NMSE {e:.2e}");
                assert!(
                    e <= NMSE_MAX,
                    "{name} block {l} {backend:?}: NMSE {e:e} > {NMSE_MAX:e}"
                );
            }
        }
    }
}

/// The fast backend's default (quantized activations where the experts'
/// format's integer kernels are the default: every GGUF type but Q4_1) and
/// the integer kernels forced (`ActMode::Q8`: every GGUF type) against the
/// same oracle.
#[test]
fn every_fixture_on_the_default_cpu_path_is_within_nmse_1e4() {
    let mut bad = Vec::new();
    for m in models() {
        let name = m["name"].as_str().unwrap();
        let ck = GgufCheckpoint::open(&gguf_path(name)).unwrap();
        let x = input(name);
        for l in usizes(&m["moe_layers"]) {
            let block = ck.moe_block(l, &|_, _| {}).unwrap();
            let want = reference(name, l);
            let run = |mode| {
                with_act_mode(mode, || block.forward_on(Backend::CpuFast, &x))
                    .unwrap()
                    .out
                    .to_f32_vec()
                    .unwrap()
            };
            let (auto, q8) = (run(ActMode::Auto), run(ActMode::Q8));
            let parts = block.parts();
            let mut formats = vec![parts.down.format()];
            match &parts.gate_up {
                GateUp::Separate { gate, up } => formats.extend([gate.format(), up.format()]),
                GateUp::Fused(w) => formats.push(w.format()),
            }
            if !formats.contains(&WeightFormat::Ggml(GgmlType::Q4_1)) {
                assert_eq!(auto, q8, "{name}: Auto takes the q8 path wherever it can");
            }
            for (mode, got) in [("default", &auto), ("q8", &q8)] {
                let e = nmse(got, &want);
                println!("{name} block {l} CpuFast ({mode} activations): NMSE {e:.2e}");
                if e > NMSE_Q8 {
                    bad.push(format!(
                        "{name} block {l} ({mode}): NMSE {e:e} > {NMSE_Q8:e}"
                    ));
                }
            }
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

fn is_shared(t: &Tensor) -> bool {
    matches!(t.storage(), Storage::Cpu(Bytes::Shared { .. }))
}

#[test]
fn weights_are_zero_copy_views_except_interleaved_per_expert_tensors() {
    let ck = GgufCheckpoint::open(&gguf_path("qwen2moe_q4_0")).unwrap();
    let b = ck.moe_block(0, &|_, _| {}).unwrap();
    let p = b.parts();
    assert!(is_shared(p.router_weight.data()) && is_shared(p.down.data()));
    let s = p.shared.as_ref().unwrap();
    assert!(is_shared(s.down.data()) && is_shared(s.gate.as_ref().unwrap().data()));

    // Block 0 stores experts interleaved (gate.0, down.0, up.0, gate.1, …):
    // stacked by copying. Block 1 stores each projection's experts back to
    // back: one view. Both give the oracle's output (checked above).
    let ck = GgufCheckpoint::open(&gguf_path("mixtral_per_expert")).unwrap();
    let b0 = ck.moe_block(0, &|_, _| {}).unwrap();
    let b1 = ck.moe_block(1, &|_, _| {}).unwrap();
    assert!(!is_shared(b0.parts().down.data()));
    assert!(is_shared(b1.parts().down.data()));
}

#[test]
fn version_2_files_load_the_same() {
    let mut bytes = read_bytes("deepseek2_v3");
    assert_eq!(bytes[4..8], 3u32.to_le_bytes());
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let ck = parse(bytes).unwrap();
    assert_eq!(ck.file().version(), 2);
    let x = input("deepseek2_v3");
    let block = ck.moe_block(1, &|_, _| {}).unwrap();
    let got = with_act_mode(ActMode::F32, || block.forward(&x))
        .unwrap()
        .to_f32_vec()
        .unwrap();
    assert!(nmse(&got, &reference("deepseek2_v3", 1)) <= NMSE_MAX);

    let mut bytes = read_bytes("deepseek2_v3");
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    let e = parse(bytes).unwrap_err().to_string();
    assert!(e.contains("version 1"), "{e}");
    let mut bytes = read_bytes("deepseek2_v3");
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    let e = parse(bytes).unwrap_err().to_string();
    assert!(e.contains("big-endian"), "{e}");
}

fn check_value(key: &str, v: &Value, ty: &str, want: &Json) {
    assert_eq!(v.type_name(), ty, "{key}");
    match v {
        Value::String(s) => assert_eq!(s, want.as_str().unwrap(), "{key}"),
        Value::Bool(b) => assert_eq!(*b, want.as_bool().unwrap(), "{key}"),
        Value::F32(f) => assert_eq!(*f as f64, want.as_f64().unwrap(), "{key}"),
        Value::F64(f) => assert_eq!(*f, want.as_f64().unwrap(), "{key}"),
        Value::I8(_) | Value::I16(_) | Value::I32(_) | Value::I64(_) => {
            assert_eq!(v.as_f64().unwrap() as i64, want.as_i64().unwrap(), "{key}")
        }
        Value::Array(items) => {
            let want = want.as_array().unwrap();
            assert_eq!(items.len(), want.len(), "{key}");
            for (item, w) in items.iter().zip(want) {
                check_value(key, &item, w[0].as_str().unwrap(), &w[1]);
            }
        }
        _ => assert_eq!(v.as_u64().unwrap(), want.as_u64().unwrap(), "{key}"),
    }
}

#[test]
fn metadata_of_every_type_parses() {
    let f = GgufFile::open(&gguf_path("metadata_types")).unwrap();
    let want = manifest()["metadata"].as_array().unwrap().clone();
    assert_eq!(f.metadata().len(), want.len());
    for (w, (key, v)) in want.iter().zip(f.metadata()) {
        assert_eq!(key, w[0].as_str().unwrap());
        check_value(key, v, w[1].as_str().unwrap(), &w[2]);
        assert_eq!(f.get(key), Some(v));
    }
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    let a = f.tensor("a").unwrap();
    let b = f.tensor("b").unwrap();
    assert_eq!((a.ne.clone(), a.ty.name, a.nbytes), (vec![3], "f32", 12));
    assert_eq!(
        (b.ne.clone(), b.shape(), b.ty.name, b.nbytes),
        (vec![3, 2], vec![2, 3], "f16", 12)
    );
    assert_eq!(a.start, f.data_offset());
    assert_eq!(b.start, f.data_offset() + 64, "second tensor aligned to 64");
    let data = f.tensor_bytes(a).unwrap();
    let vals: Vec<f32> = data
        .as_slice()
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(vals, vec![0.0, 1.0, 2.0]);
    // A GGUF with no block_count is not a checkpoint.
    let e = GgufCheckpoint::open(&gguf_path("metadata_types"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("llama.block_count"), "{e}");
}

/// The error of opening `bytes` or, if that works, of building block `layer`.
fn load_err(bytes: Vec<u8>, layer: usize) -> String {
    match parse(bytes) {
        Ok(ck) => ck
            .moe_block(layer, &|_, _| {})
            .expect_err("load should fail")
            .to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn missing_and_misnamed_tensors_are_named() {
    let base = read_bytes("qwen3moe_f32");
    let mut b = base.clone();
    assert_eq!(
        replace_all(&mut b, b"blk.0.ffn_down_exps", b"blk.0.ffn_dowm_exps"),
        1
    );
    let e = load_err(b, 0);
    assert!(
        e.contains("missing tensor `blk.0.ffn_down_exps.weight`"),
        "{e}"
    );

    let mut b = base.clone();
    replace_all(&mut b, b"blk.0.ffn_gate_exps", b"blk.0.ffn_gate_expz");
    let e = load_err(b, 0);
    assert!(
        e.contains("missing tensor `blk.0.ffn_gate_exps.weight`"),
        "{e}"
    );

    // An expert bias moekit cannot apply is refused, not ignored.
    let mut b = base.clone();
    replace_all(
        &mut b,
        b"blk.0.ffn_up_exps.weight",
        b"blk.0.ffn_up_exps.bias\0\0",
    );
    let e = load_err(b, 0);
    assert!(e.contains("blk.0.ffn_up_exps.bias"), "{e}");

    // Without its router, block 0 is not an MoE block.
    let mut b = base.clone();
    replace_all(&mut b, b"blk.0.ffn_gate_inp", b"blk.0.ffn_gate_inq");
    let ck = parse(b).unwrap();
    assert!(ck.summary().moe_layers.is_empty());
    let e = ck.moe_block(0, &|_, _| {}).unwrap_err().to_string();
    assert!(e.contains("no `blk.0.ffn_gate_inp.weight`"), "{e}");

    // qwen2moe's shared expert gate is required.
    let mut b = read_bytes("qwen2moe_q4_0");
    replace_all(&mut b, b"ffn_gate_inp_shexp", b"ffn_gate_inp_shexq");
    let e = load_err(b, 0);
    assert!(
        e.contains("missing tensor `blk.0.ffn_gate_inp_shexp.weight`"),
        "{e}"
    );

    // glm4moe requires the selection bias.
    let mut b = read_bytes("glm4moe_q8_0");
    replace_all(&mut b, b"exp_probs_b", b"exp_probs_c");
    let e = load_err(b, 1);
    assert!(e.contains("missing tensor `blk.1.exp_probs_b.bias`"), "{e}");

    // minimax-m2 requires the selection bias and the gating key (llama.cpp
    // has no default for it).
    let base = read_bytes("minimax_m2_q4_1");
    let mut b = base.clone();
    replace_all(&mut b, b"exp_probs_b", b"exp_probs_c");
    let e = load_err(b, 0);
    assert!(e.contains("missing tensor `blk.0.exp_probs_b.bias`"), "{e}");
    let mut b = base;
    assert_eq!(
        replace_all(
            &mut b,
            b"minimax-m2.expert_gating_func",
            b"minimax-m2.expert_gating_fund"
        ),
        1
    );
    let e = load_err(b, 0);
    assert!(
        e.contains("missing key `minimax-m2.expert_gating_func`"),
        "{e}"
    );
}

#[test]
fn dense_and_out_of_range_blocks_are_errors() {
    let ck = GgufCheckpoint::open(&gguf_path("deepseek2_v2")).unwrap();
    let e = ck.moe_block(0, &|_, _| {}).unwrap_err().to_string();
    assert!(
        e.contains("leading dense block") && e.contains("deepseek2_v2.gguf"),
        "{e}"
    );
    let e = ck.moe_block(2, &|_, _| {}).unwrap_err().to_string();
    assert!(e.contains("< 2"), "{e}");
    assert!(ck.router_config(0).is_err());
    assert!(ck.moe_block(1, &|_, _| {}).is_ok());
}

#[test]
fn unsupported_types_and_architectures_are_named() {
    // q1_0 (not supported yet) takes fewer bytes than the q8_0 it relabels,
    // so the file stays valid.
    let mut b = read_bytes("glm4moe_q8_0");
    let at = type_id_offset(&b, "blk.1.ffn_up_exps.weight");
    assert_eq!(b[at..at + 4], 8u32.to_le_bytes(), "q8_0");
    b[at..at + 4].copy_from_slice(&41u32.to_le_bytes());
    let ck = parse(b).unwrap();
    let e = ck.moe_block(1, &|_, _| {}).unwrap_err().to_string();
    assert!(
        e.contains("blk.1.ffn_up_exps.weight")
            && e.contains("q1_0")
            && e.contains("in-memory.gguf"),
        "{e}"
    );
    assert!(ck.tensors().iter().any(|t| t.format == "q1_0"));

    let mut b = read_bytes("olmoe_q5");
    assert!(replace_all(&mut b, b"olmoe", b"olmoz") > 1);
    let e = parse(b).unwrap_err().to_string();
    // The message names the key and lists the family table's architectures.
    let list = moekit::load::family::gguf_archs().join(", ");
    assert!(
        e.contains("`general.architecture` `olmoz` is not supported")
            && e.contains(&format!("(supported: {list})")),
        "{e}"
    );

    // Softmax routing with expert groups is refused (see load::gguf::arch).
    let mut b = read_bytes("deepseek2_v3");
    let key = b"deepseek2.expert_gating_func";
    let at = b.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(b[at..at + 8], [4, 0, 0, 0, 2, 0, 0, 0], "u32 2 (sigmoid)");
    b[at + 4] = 1;
    let e = parse(b).unwrap_err().to_string();
    assert!(e.contains("softmax gating with 4 expert groups"), "{e}");
}

/// Relabels `blk.{layer}.ffn_up_exps.weight` of fixture `name` from ggml
/// type `from` to `to` (same or fewer bytes: the file stays valid), then
/// checks the layer loads in format `want` and runs on both CPU backends
/// (f32 activations) within NMSE_MAX of each other, finite, and away from
/// the fixture's own output (other weights).
fn relabelled_layer_runs(name: &str, layer: usize, from: u32, to: u32, want: &str) {
    let mut b = read_bytes(name);
    let at = type_id_offset(&b, &format!("blk.{layer}.ffn_up_exps.weight"));
    assert_eq!(b[at..at + 4], from.to_le_bytes(), "{name}: type {from}");
    b[at..at + 4].copy_from_slice(&to.to_le_bytes());
    let ck = parse(b).unwrap();
    let block = ck.moe_block(layer, &|_, _| {}).unwrap();
    let moekit::ops::act::GateUp::Separate { up, .. } = &block.parts().gate_up else {
        panic!("separate gate and up");
    };
    assert_eq!(up.format().to_string(), want);
    let x = input(name);
    let run = |backend| {
        let out = with_act_mode(ActMode::F32, || block.forward_on(backend, &x))
            .unwrap()
            .out;
        out.to_f32_vec().unwrap()
    };
    let (refr, fast) = (run(Backend::CpuReference), run(Backend::CpuFast));
    assert!(refr.iter().all(|v| v.is_finite()), "{want}");
    let e = nmse(&fast, &refr);
    assert!(e <= NMSE_MAX, "{want}: fast vs reference: NMSE {e:e}");
    assert!(nmse(&refr, &reference(name, layer)) > 1e-3, "{want}");
}

#[test]
fn q4_0_bytes_read_as_iq4_nl_run_on_both_cpu_paths() {
    // iq4_nl has q4_0's block size and bytes: only the type id changes, and
    // the layer that refused it before issue 12 now runs.
    relabelled_layer_runs("qwen2moe_q4_0", 0, 2, 20, "iq4_nl");
}

#[test]
fn q8_0_bytes_read_as_nvfp4_run_on_both_cpu_paths() {
    // NVFP4 (64-weight blocks of 36 bytes) takes fewer bytes than the q8_0
    // it relabels; the random q8_0 bytes make every scale byte appear, so
    // the weights are large but finite (unsigned e4m3 tops out at 240 after
    // halving).
    relabelled_layer_runs("glm4moe_q8_0", 1, 8, 40, "nvfp4");

    // A per-expert scale that is not an [E] vector is refused by name (the
    // renamed up weights: [E, I, H] q8_0), before the missing weight.
    let mut b = read_bytes("glm4moe_q8_0");
    let from = b"blk.1.ffn_up_exps.weight";
    let to = b"blk.1.ffn_up_exps.scale\0";
    assert_eq!(replace_all(&mut b, from, &to[..from.len()]), 1);
    let e = match parse(b).and_then(|ck| ck.moe_block(1, &|_, _| {}).map(|_| ())) {
        Err(e) => e.to_string(),
        Ok(()) => panic!("a layer with a [E, I, H] `ffn_up_exps.scale` loaded"),
    };
    assert!(e.contains("blk.1.ffn_up_exps.scale"), "{e}");
}

#[test]
fn per_expert_scales_are_read_and_unknown_expert_extras_refused() {
    // The fixtures' ffn_{gate,up,down}_exps.scale become the block's expert
    // scales (their values: every_fixture_matches_the_numpy_oracle).
    for name in ["qwen2moe_nvfp4_scales", "gpt_oss_scales_q8_0"] {
        let block = parse(read_bytes(name))
            .unwrap()
            .moe_block(0, &|_, _| {})
            .unwrap();
        let s = &block.parts().ffn.scale;
        let [g, u, d] = [&s.gate, &s.up, &s.down].map(|t| t.as_ref().map(|t| t.shape().to_vec()));
        assert_eq!(
            (g, u, d.clone()),
            (Some(vec![4]), Some(vec![4]), Some(vec![4])),
            "{name}"
        );
    }
    // Gemma-4's ffn_down_exps.scale stays its router's per-expert scale.
    let block = parse(read_bytes("gemma4_q8_0"))
        .unwrap()
        .moe_block(0, &|_, _| {})
        .unwrap();
    assert!(!block.parts().ffn.scale.any());
    assert!(matches!(
        block.parts().router.kind,
        moekit::ops::route::RouterKind::Gemma4 { .. }
    ));
    // An extra beside a stem moekit reads (`ffn_gate_up_exps.sc`, the
    // fixture's gate scale renamed in place) is refused by name, not ignored.
    let mut b = read_bytes("qwen2moe_nvfp4_scales");
    let from = b"blk.0.ffn_gate_exps.scale";
    let to = b"blk.0.ffn_gate_up_exps.sc";
    assert_eq!(replace_all(&mut b, from, to), 1);
    let e = match parse(b).and_then(|ck| ck.moe_block(0, &|_, _| {}).map(|_| ())) {
        Err(e) => e.to_string(),
        Ok(()) => panic!("a layer with `ffn_gate_up_exps.sc` loaded"),
    };
    assert!(e.contains("blk.0.ffn_gate_up_exps.sc"), "{e}");
}

/// Loads `bytes` completely (summary, listing, every MoE block, a forward
/// pass when `x` fits); `Some(ok)` unless it panicked.
fn try_load(bytes: Vec<u8>, x: Option<&Tensor>) -> Option<bool> {
    catch_unwind(AssertUnwindSafe(|| {
        let run = || -> moekit::Result<()> {
            let ck = parse(bytes)?;
            let _ = ck.tensors();
            for (_, v) in ck.file().metadata() {
                let _ = (
                    v.as_u64(),
                    v.as_f64(),
                    v.as_str(),
                    v.as_array().map(|a| a.len()),
                );
            }
            for l in ck.summary().moe_layers.clone() {
                let block = ck.moe_block(l, &|_, _| {})?;
                if let Some(x) = x.filter(|x| x.shape()[1] == block.hidden()) {
                    block.forward(x)?;
                }
            }
            Ok(())
        };
        run().is_ok()
    }))
    .ok()
}

#[test]
fn fuzzed_files_never_panic() {
    let start = std::time::Instant::now();
    let mut r = rng(0x6767_7566);
    let (mut variants, mut ok, mut err, mut panics) = (0usize, 0usize, 0usize, Vec::new());
    let bases = [
        "qwen3moe_f32",
        "deepseek2_v3",
        "mixtral_per_expert",
        "qwen2moe_q4_0",
        // Gemma-4's scale and norm tensors; Llama-4's weight before the FFN.
        "gemma4_q8_0",
        "llama4_q4_k",
        "metadata_types",
    ];
    for name in bases {
        let base = read_bytes(name);
        let header = GgufFile::parse(Arc::new(base.clone()), Path::new(name))
            .unwrap()
            .data_offset();
        let x = (name != "metadata_types").then(|| input(name));
        let mut cases: Vec<(String, Vec<u8>, bool)> = Vec::new();
        // Truncations: densely through the header, sparsely through the data.
        for cut in (0..header.min(base.len()))
            .step_by((header / 250).max(1))
            .chain((0..20).map(|i| header + (base.len() - header) * i / 20))
        {
            cases.push((format!("truncated at {cut}"), base[..cut].to_vec(), false));
        }
        // Random bytes in the header (1 to 4 of them).
        for _ in 0..300 {
            let mut b = base.clone();
            let n = r.random_range(1..=4);
            for _ in 0..n {
                let at = r.random_range(0..header);
                b[at] = r.random();
            }
            cases.push(("header bytes".into(), b, false));
        }
        // Huge counts, lengths, dims and offsets: an 8- or 4-byte field anywhere in the header.
        let huge: [u64; 6] = [
            u64::MAX,
            1 << 63,
            1 << 40,
            (1 << 32) - 1,
            1 << 31,
            0x7fff_ffff_ffff_ffff,
        ];
        for _ in 0..200 {
            let mut b = base.clone();
            let at = r.random_range(0..header - 8);
            let v = huge[r.random_range(0..huge.len())];
            let width = if r.random() { 8 } else { 4 };
            b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
            cases.push((format!("huge {v:#x} at {at}"), b, false));
        }
        for (at, v) in [
            (8usize, u64::MAX),
            (16, u64::MAX),
            (8, 1 << 40),
            (16, 1 << 40),
            (16, 0),
            (8, 0),
        ] {
            let mut b = base.clone();
            b[at..at + 8].copy_from_slice(&v.to_le_bytes());
            cases.push((format!("count {v:#x} at {at}"), b, false));
        }
        // Every position of the two smallest headers, as a huge 8-byte field.
        if name == "qwen3moe_f32" || name == "metadata_types" {
            for at in 0..header - 8 {
                for v in [u64::MAX, 1 << 40] {
                    let mut b = base.clone();
                    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
                    cases.push((format!("sweep {v:#x} at {at}"), b, false));
                }
            }
        }
        // Random bytes in the tensor data, run through a forward pass.
        for _ in 0..30 {
            let mut b = base.clone();
            for _ in 0..8 {
                let at = r.random_range(header..b.len());
                b[at] = r.random();
            }
            cases.push(("data bytes".into(), b, true));
        }
        for (what, bytes, forward) in cases {
            variants += 1;
            match try_load(bytes, if forward { x.as_ref() } else { None }) {
                Some(true) => ok += 1,
                Some(false) => err += 1,
                None => panics.push(format!("{name}: {what}")),
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{variants} variants: {ok} loaded, {err} errors, {} panics in {secs:.2} s",
        panics.len()
    );
    assert!(panics.is_empty(), "panicked on: {panics:#?}");
    assert!(variants >= 1000, "{variants} variants");
    assert!(
        ok > 0 && err > 0,
        "the mutations should produce both outcomes: {ok} ok, {err} errors"
    );
}

/// A header over a large sparse file: its counts pass the size check (they
/// fit the file), but nothing is allocated for them up front — the parser
/// reads items as the file holds them and stops at the first bad one (here
/// the second empty name). Before, it reserved count × item size (tens of
/// GB) and the process aborted.
#[test]
fn huge_claimed_counts_allocate_nothing_up_front() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("moekit-sparse-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sparse.gguf");
    let size: u64 = 64 << 30;
    let cases = [
        ((size - 24) / 24, 0u64, "duplicate tensor name"),
        (0, (size - 24) / 13, "duplicate metadata key"),
    ];
    for (n_tensors, n_kv, want) in cases {
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(b"GGUF").unwrap();
        f.write_all(&3u32.to_le_bytes()).unwrap();
        f.write_all(&n_tensors.to_le_bytes()).unwrap();
        f.write_all(&n_kv.to_le_bytes()).unwrap();
        f.set_len(size).unwrap();
        drop(f);
        let e = GgufFile::open(&path).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A name read from the file is escaped and cut in messages: a corrupt length
/// made a 100 KB key of NUL bytes, echoed whole.
#[test]
fn names_in_messages_are_escaped_and_short() {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes()); // tensors
    b.extend_from_slice(&2u64.to_le_bytes()); // metadata entries
    for _ in 0..2 {
        b.extend_from_slice(&100_000u64.to_le_bytes());
        b.extend(std::iter::repeat_n(0u8, 100_000));
        b.extend_from_slice(&0u32.to_le_bytes()); // u8 value
        b.push(7);
    }
    let e = GgufFile::parse(Arc::new(b), Path::new("names.gguf"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("duplicate metadata key"), "{e}");
    assert!(
        e.len() < 600 && e.contains("\\0") && !e.contains('\0'),
        "{e}"
    );
}

/// `deepseek2_v3_negbias` (negative `exp_probs_b`): llama.cpp masks the
/// dropped groups with −∞, mlx-lm with 0.0, and on this input the two pick
/// different experts on every token. The loader chooses llama.cpp's rule and
/// the CPU reference matches the numpy transcription of `build_moe_ffn` to
/// NMSE ≤ 1e-10; the same block with mlx-lm's rule does not.
#[test]
fn negative_bias_fixture_follows_llama_cpp_group_masking() {
    const NMSE_REF: f64 = 1e-10;
    let name = "deepseek2_v3_negbias";
    let ck = GgufCheckpoint::open(&gguf_path(name)).unwrap();
    let s = ck.summary();
    assert!(
        s.router.contains("dropped groups' keys -inf, as llama.cpp"),
        "{}",
        s.router
    );
    let (x, want) = (input(name), reference(name, 1));
    let block = ck.moe_block(1, &|_, _| {}).unwrap();
    let got = block.forward_on(Backend::CpuReference, &x).unwrap().out;
    let e = nmse(&got.to_f32_vec().unwrap(), &want);
    println!("{name} CpuReference, GroupMask::NegInf: NMSE {e:.2e}");
    assert!(e <= NMSE_REF, "{name}: NMSE {e:e} > {NMSE_REF:e}");

    let mut parts = block.parts().clone();
    match &mut parts.router.kind {
        RouterKind::Grouped { dropped_groups, .. } => {
            assert_eq!(*dropped_groups, GroupMask::NegInf);
            *dropped_groups = GroupMask::Zero;
        }
        k => panic!("{name}: router {k:?}"),
    }
    let zero = moekit::moe::MoeBlock::new(parts).unwrap();
    for backend in [Backend::CpuReference, Backend::CpuFast] {
        let got = with_act_mode(ActMode::F32, || zero.forward_on(backend, &x))
            .unwrap()
            .out;
        let e = nmse(&got.to_f32_vec().unwrap(), &want);
        println!("{name} {backend:?}, GroupMask::Zero (mlx-lm's rule): NMSE {e:.2e}");
        assert!(
            e > 1e-3,
            "{name} {backend:?}: the 0.0 mask matches too (NMSE {e:e})"
        );
    }
}

//! Whole MoE blocks against mlx-lm's own block classes (fixtures/moe, see its
//! README): Qwen3-MoE (f32, bf16 weights, 3/4/6-bit), Qwen2-MoE (gated shared
//! expert), Mixtral (f32, 4-bit), DeepSeek-V3 (sigmoid, bias, groups, shared
//! experts; f32 and 8-bit), Qwen3-Next (f32, 4-bit).
//!
//! The block is rebuilt from the dumped parameters; chosen experts must equal
//! mlx-lm's exactly (as a set per token), routing weights and outputs within
//! NMSE ≤ 1e-10 (both are f32 math in a different summation order; the fast
//! path with f32 activations), and outputs within 1e-4 with the fast path's
//! default activations.

mod common_util;
use common_util::{fixture, nmse};
use moekit::cpu::{with_act_mode, ActMode};
use moekit::format::AffineParams;
use moekit::moe::{MoeBlock, MoeBlockParts, SharedExpert};
use moekit::npy::{NpyArray, NpyDType};
use moekit::ops::act::GateUp;
use moekit::ops::route::{GroupMask, RouterConfig, RouterKind, Scoring};
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};
use serde_json::Value;
use std::path::Path;

const NMSE_BOUND: f64 = 1e-10;
/// The fast CPU path's default activations (8-bit blocks for the formats
/// with integer kernels, here the 4-bit affine experts): output NMSE ≤ 1e-4
/// (routing unchanged: the router runs with f32 activations).
const NMSE_Q8: f64 = 1e-4;

fn npy(dir: &Path, name: &str) -> NpyArray {
    NpyArray::read(dir.join(format!("{name}.npy"))).unwrap_or_else(|e| panic!("{e}"))
}

/// Loads module `path` (`[E?, out, in]`) as QuantWeights per config.json.
fn weights(dir: &Path, cfg: &Value, path: &str) -> QuantWeights {
    let w = npy(dir, &format!("{path}.weight"));
    let lead = |s: &[usize]| if s.len() == 3 { s[0] } else { 1 };
    let (e, rows) = (lead(&w.shape), w.shape[w.shape.len() - 2]);
    let q = &cfg["quantization"][path];
    if q.is_null() {
        let t = w.to_tensor().unwrap(); // f32, or <u2 = bf16 bits
        let cols = w.shape[w.shape.len() - 1];
        QuantWeights::new(WeightFormat::Dense(t.dtype()), e, rows, cols, t, None, None).unwrap()
    } else {
        let bits = q["bits"].as_u64().unwrap() as u32;
        let group_size = q["group_size"].as_u64().unwrap() as usize;
        let cols = w.shape[w.shape.len() - 1] * 32 / bits as usize;
        let f = WeightFormat::Affine(AffineParams { bits, group_size });
        let aux = |n: &str| Some(npy(dir, &format!("{path}.{n}")).to_tensor().unwrap());
        QuantWeights::new(
            f,
            e,
            rows,
            cols,
            w.to_tensor().unwrap(),
            aux("scales"),
            aux("biases"),
        )
        .unwrap()
    }
}

fn vecf(a: &NpyArray) -> Vec<f32> {
    match a.dtype {
        NpyDType::U16 => a.bf16_bits_to_f32().unwrap(),
        _ => a.to_f32().unwrap(),
    }
}

fn build(dir: &Path, cfg: &Value) -> MoeBlock {
    let n_experts = cfg["n_experts"].as_u64().unwrap() as usize;
    let top_k = cfg["top_k"].as_u64().unwrap() as usize;
    let norm = cfg["norm_topk_prob"].as_bool().unwrap();
    let kind = match cfg["scoring"].as_str().unwrap() {
        "softmax" => RouterKind::SoftmaxTopK {
            norm_topk_prob: norm,
        },
        "topk_softmax" => RouterKind::TopKSoftmax,
        "sigmoid" => RouterKind::Grouped {
            scoring: Scoring::Sigmoid,
            bias: Some(vecf(&npy(dir, "gate.e_score_correction_bias"))),
            n_group: cfg["n_group"].as_u64().unwrap() as usize,
            topk_group: cfg["topk_group"].as_u64().unwrap() as usize,
            dropped_groups: GroupMask::Zero,
            norm_topk_prob: norm,
            routed_scaling_factor: cfg["routed_scaling_factor"].as_f64().unwrap() as f32,
        },
        s => panic!("unknown scoring {s}"),
    };
    let rw = weights(dir, cfg, "gate");
    let router_weight = QuantWeights::new(
        rw.format(),
        1,
        rw.rows(),
        rw.cols(),
        rw.data().clone(),
        rw.scales().cloned(),
        rw.biases().cloned(),
    )
    .unwrap();
    let gate_up = GateUp::separate(
        weights(dir, cfg, "switch_mlp.gate_proj"),
        weights(dir, cfg, "switch_mlp.up_proj"),
    )
    .unwrap();
    let down = weights(dir, cfg, "switch_mlp.down_proj");
    let shared = cfg["shared_prefix"].as_str().map(|p| SharedExpert {
        gate_up: GateUp::separate(
            weights(dir, cfg, &format!("{p}.gate_proj")),
            weights(dir, cfg, &format!("{p}.up_proj")),
        )
        .unwrap(),
        down: weights(dir, cfg, &format!("{p}.down_proj")),
        gate: cfg["shared_gate"]
            .as_str()
            .map(|_| weights(dir, cfg, "shared_expert_gate")),
    });
    let router = RouterConfig {
        kind,
        n_experts,
        top_k,
    };
    MoeBlock::new(MoeBlockParts {
        router,
        router_weight,
        gate_up,
        down,
        shared,
        ffn: Default::default(),
    })
    .unwrap()
}

/// (id, weight) pairs of each token, sorted by id.
fn pairs(ids: &[u32], w: &[f32], k: usize) -> Vec<Vec<(u32, f32)>> {
    ids.chunks(k)
        .zip(w.chunks(k))
        .map(|(i, w)| {
            let mut p: Vec<_> = i.iter().copied().zip(w.iter().copied()).collect();
            p.sort_by_key(|x| x.0);
            p
        })
        .collect()
}

#[test]
fn moe_blocks_match_mlx_lm() {
    let root = fixture("moe");
    let mut cases: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|d| d.ok())
        .map(|d| d.path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    assert!(
        cases.len() >= 12,
        "expected the 12 mlx-lm cases, found {}",
        cases.len()
    );
    for dir in cases {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        let block = build(&dir, &cfg);
        let x = npy(&dir, "x").to_tensor().unwrap();
        let want = npy(&dir, "out").to_f32().unwrap();
        let k = cfg["top_k"].as_u64().unwrap() as usize;
        let want_ids = npy(&dir, "ids").to_u32().unwrap();
        let want_w = npy(&dir, "weights").to_f32().unwrap();
        let want_pairs = pairs(&want_ids, &want_w, k);
        for (backend, mode) in [
            (Backend::CpuReference, ActMode::F32),
            (Backend::CpuFast, ActMode::F32),
            (Backend::CpuFast, ActMode::Auto),
        ] {
            let trace = with_act_mode(mode, || block.forward_on(backend, &x)).unwrap();
            let got_pairs = pairs(
                trace.routing.ids.as_slice::<u32>().unwrap(),
                trace.routing.weights.as_slice::<f32>().unwrap(),
                k,
            );
            for (t, (g, w)) in got_pairs.iter().zip(&want_pairs).enumerate() {
                let gi: Vec<u32> = g.iter().map(|p| p.0).collect();
                let wi: Vec<u32> = w.iter().map(|p| p.0).collect();
                assert_eq!(gi, wi, "{name} {backend:?}: experts of token {t}");
            }
            let flat =
                |p: &Vec<Vec<(u32, f32)>>| p.iter().flatten().map(|x| x.1).collect::<Vec<f32>>();
            let ew = nmse(&flat(&got_pairs), &flat(&want_pairs));
            let eo = nmse(&trace.out.to_f32_vec().unwrap(), &want);
            println!(
                "{name:<20} {backend:?} ({mode} activations): routing-weight NMSE {ew:.2e}, \
                 output NMSE {eo:.2e}"
            );
            // The router always runs with f32 activations.
            assert!(
                ew <= NMSE_BOUND,
                "{name} {backend:?}: routing weights NMSE {ew:e}"
            );
            let bound = if mode == ActMode::F32 {
                NMSE_BOUND
            } else {
                NMSE_Q8
            };
            assert!(eo <= bound, "{name} {backend:?} {mode}: output NMSE {eo:e}");
        }
        // The block also runs with half-precision activations (output NMSE vs f32 oracle ≤ 1e-3).
        let xb = x.to_dtype(DType::Bf16).unwrap();
        let ob = block.forward(&xb).unwrap();
        assert_eq!(ob.dtype(), DType::Bf16);
        let e = nmse(&ob.to_f32_vec().unwrap(), &want);
        assert!(e <= 1e-3, "{name} bf16 activations: NMSE {e:e}");
    }
}

#[test]
fn forward_into_and_shape_errors() {
    let dir = fixture("moe/qwen3_moe_f32");
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let block = build(&dir, &cfg);
    let x = npy(&dir, "x").to_tensor().unwrap();
    let mut out = Tensor::zeros(DType::F32, x.shape());
    block.forward_into(&x, &mut out).unwrap();
    assert_eq!(
        out.to_f32_vec().unwrap(),
        block.forward(&x).unwrap().to_f32_vec().unwrap()
    );
    let mut wrong = Tensor::zeros(DType::F32, &[1, 64]);
    assert!(block.forward_into(&x, &mut wrong).is_err());
    let bad = Tensor::zeros(DType::F32, &[2, 63]);
    let e = block.forward(&bad).unwrap_err().to_string();
    assert!(
        e.contains("forward: argument `x`") && e.contains("[T, 64]") && !e.contains("::"),
        "{e}"
    );
}

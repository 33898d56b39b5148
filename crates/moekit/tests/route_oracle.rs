//! `ops::route` against mlx-lm's gate code and, for the cases with
//! `dropped_groups: "neg_inf"`, a numpy transcription of llama.cpp's
//! `build_moe_ffn` (fixtures from `scripts/fixtures/route.py`), fast ==
//! reference, and argument rejection.
//!
//! Thresholds: ids exactly equal (as a set per token: mlx's slot order is
//! `argpartition`'s); weights NMSE ≤ 1e-10 against mlx-lm's f32 weights
//! (paired by expert id); fast and reference bit-identical.

use moekit::npy::NpyArray;
use moekit::ops::route::{route, route_on, GroupMask, RouterConfig, RouterKind, Scoring};
use moekit::{Backend, DType, Tensor};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::path::PathBuf;

const NMSE_MAX: f64 = 1e-10;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/route")
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (a as f64 - b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|&b| (b as f64).powi(2)).sum();
    num / den
}

fn f32_list(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn config(c: &Value) -> RouterConfig {
    let kind = match c["kind"].as_str().expect("kind") {
        "softmax_topk" => RouterKind::SoftmaxTopK {
            norm_topk_prob: c["norm_topk_prob"].as_bool().expect("bool"),
        },
        "topk_softmax" => RouterKind::TopKSoftmax,
        "gemma4" => RouterKind::Gemma4 {
            per_expert_scale: f32_list(&c["per_expert_scale"]),
        },
        "grouped" => RouterKind::Grouped {
            scoring: match c["scoring"].as_str().expect("scoring") {
                "softmax" => Scoring::Softmax,
                _ => Scoring::Sigmoid,
            },
            bias: (!c["bias"].is_null()).then(|| f32_list(&c["bias"])),
            n_group: c["n_group"].as_u64().expect("n_group") as usize,
            topk_group: c["topk_group"].as_u64().expect("topk_group") as usize,
            dropped_groups: match c["dropped_groups"].as_str() {
                None | Some("zero") => GroupMask::Zero,
                Some("neg_inf") => GroupMask::NegInf,
                Some(other) => panic!("unknown dropped_groups {other}"),
            },
            norm_topk_prob: c["norm_topk_prob"].as_bool().expect("bool"),
            routed_scaling_factor: c["routed_scaling_factor"].as_f64().expect("rsf") as f32,
        },
        other => panic!("unknown kind {other}"),
    };
    RouterConfig {
        kind,
        n_experts: c["n_experts"].as_u64().expect("E") as usize,
        top_k: c["top_k"].as_u64().expect("k") as usize,
    }
}

/// (ids, weights) with each token's slots sorted by expert id.
fn by_id(ids: &[u32], w: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let mut out_i = Vec::new();
    let mut out_w = Vec::new();
    for (ti, tw) in ids.chunks(k).zip(w.chunks(k)) {
        let mut pairs: Vec<(u32, f32)> = ti.iter().copied().zip(tw.iter().copied()).collect();
        pairs.sort_by_key(|p| p.0);
        out_i.extend(pairs.iter().map(|p| p.0));
        out_w.extend(pairs.iter().map(|p| p.1));
    }
    (out_i, out_w)
}

/// The selection key of each expert for the non-grouped rules (the logit).
fn check_slot_order(logits: &[f32], ids: &[u32], e: usize, k: usize) {
    for (row, ti) in logits.chunks(e).zip(ids.chunks(k)) {
        for pair in ti.windows(2) {
            let (a, b) = (pair[0] as usize, pair[1] as usize);
            assert!(
                row[a] > row[b] || (row[a] == row[b] && a < b),
                "slot order: {a} ({}) before {b} ({})",
                row[a],
                row[b]
            );
        }
    }
}

#[test]
fn matches_mlx_lm_gate_code() {
    let dir = fixtures();
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).expect("cases.json"))
            .expect("json");
    let cases = cases.as_array().expect("list");
    assert!(
        cases.len() >= 12,
        "expected every family, got {}",
        cases.len()
    );
    for c in cases {
        let name = c["name"].as_str().expect("name");
        let cfg = config(c);
        let logits = NpyArray::read(dir.join(format!("{name}_logits.npy")))
            .expect("logits")
            .to_tensor()
            .expect("tensor");
        let want_ids = NpyArray::read(dir.join(format!("{name}_ids.npy")))
            .expect("ids")
            .to_u32()
            .expect("u32");
        let want_w = NpyArray::read(dir.join(format!("{name}_weights.npy")))
            .expect("w")
            .to_f32()
            .expect("f32");
        let mut outs = Vec::new();
        for backend in [Backend::CpuReference, Backend::CpuFast] {
            let r = route_on(backend, &logits, &cfg).expect("route");
            assert_eq!(r.ids.shape(), &[logits.shape()[0], cfg.top_k]);
            assert_eq!(r.weights.shape(), &[logits.shape()[0], cfg.top_k]);
            let (ids, w) = (
                r.ids.as_slice::<u32>().expect("ids").to_vec(),
                r.weights.as_slice::<f32>().expect("w").to_vec(),
            );
            let (si, sw) = by_id(&ids, &w, cfg.top_k);
            assert_eq!(
                si, want_ids,
                "{name} {backend:?}: ids differ from the oracle"
            );
            let e = nmse(&sw, &want_w);
            assert!(
                e <= NMSE_MAX,
                "{name} {backend:?}: weights NMSE {e:e} > {NMSE_MAX:e}"
            );
            println!("{name:24} {backend:?}: ids exact, weights NMSE {e:.2e}");
            if !matches!(cfg.kind, RouterKind::Grouped { .. }) {
                check_slot_order(
                    &logits.to_f32_vec().expect("f32"),
                    &ids,
                    cfg.n_experts,
                    cfg.top_k,
                );
            }
            outs.push((ids, w));
        }
        assert_eq!(outs[0], outs[1], "{name}: fast != reference");
    }
}

#[test]
fn plain_route_uses_the_device_backend() {
    let logits = Tensor::from_f32(&[0.1, 0.9, 0.3, 0.9], &[1, 4], DType::F32).expect("t");
    let cfg = RouterConfig {
        kind: RouterKind::TopKSoftmax,
        n_experts: 4,
        top_k: 2,
    };
    let r = route(&logits, &cfg).expect("route");
    // Tie between experts 1 and 3 → both chosen, lower index first.
    assert_eq!(r.ids.as_slice::<u32>().expect("ids"), &[1, 3]);
    assert_eq!(r.weights.as_slice::<f32>().expect("w"), &[0.5, 0.5]);
}

fn all_kinds(rng: &mut impl Rng, e: usize) -> Vec<RouterKind> {
    let mut v: Vec<f32> = (0..e).map(|_| rng.random_range(-0.2f32..0.2)).collect();
    v[e / 2] = v[0]; // a bias tie
    let scale: Vec<f32> = (0..e).map(|_| rng.random_range(0.5f32..1.5)).collect();
    let mut kinds = vec![
        RouterKind::SoftmaxTopK {
            norm_topk_prob: true,
        },
        RouterKind::SoftmaxTopK {
            norm_topk_prob: false,
        },
        RouterKind::TopKSoftmax,
        RouterKind::Gemma4 {
            per_expert_scale: scale,
        },
    ];
    for (scoring, bias, norm) in [
        (Scoring::Sigmoid, Some(v.clone()), true),
        (Scoring::Softmax, None, false),
        (
            Scoring::Sigmoid,
            Some(v.iter().map(|b| b - 0.6).collect()),
            true,
        ),
        (Scoring::Softmax, Some(v.clone()), true),
    ] {
        for n_group in [1, 8, 32] {
            if e.is_multiple_of(n_group) {
                let topk_group = (n_group / 2).max(1);
                // The mask matters only where groups are dropped.
                let masks: &[GroupMask] = if n_group > 1 {
                    &[GroupMask::Zero, GroupMask::NegInf]
                } else {
                    &[GroupMask::Zero]
                };
                for &dropped_groups in masks {
                    kinds.push(RouterKind::Grouped {
                        scoring,
                        bias: bias.clone(),
                        n_group,
                        topk_group,
                        dropped_groups,
                        norm_topk_prob: norm,
                        routed_scaling_factor: 2.5,
                    });
                }
            }
        }
    }
    kinds
}

#[test]
fn fast_equals_reference_on_random_inputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for (t, e, k) in [
        (37, 1024, 32),
        (50, 256, 8),
        (33, 64, 6),
        (17, 8, 8),
        (5, 1, 1),
        (0, 16, 2),
    ] {
        for kind in all_kinds(&mut rng, e) {
            let cfg = RouterConfig {
                kind,
                n_experts: e,
                top_k: k,
            };
            if cfg.validate().is_err() {
                continue; // e.g. k > topk_group · E / n_group
            }
            // Logits on a coarse grid: many exact ties.
            let x: Vec<f32> = (0..t * e)
                .map(|_| (rng.random_range(-12i32..12) as f32) * 0.25)
                .collect();
            for dtype in [DType::F32, DType::F16, DType::Bf16] {
                let logits = Tensor::from_f32(&x, &[t, e], dtype).expect("t");
                let a = route_on(Backend::CpuReference, &logits, &cfg).expect("ref");
                let b = route_on(Backend::CpuFast, &logits, &cfg).expect("fast");
                assert_eq!(
                    a.ids.as_slice::<u32>().expect("i"),
                    b.ids.as_slice::<u32>().expect("i"),
                    "{cfg:?} {dtype}"
                );
                let (wa, wb) = (
                    a.weights.as_slice::<f32>().expect("w"),
                    b.weights.as_slice::<f32>().expect("w"),
                );
                assert!(
                    wa.iter().zip(wb).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "{:?} {dtype}: weights differ",
                    cfg.kind
                );
                // Every token gets k distinct experts.
                for ids in a.ids.as_slice::<u32>().expect("i").chunks(k) {
                    let mut s = ids.to_vec();
                    s.sort();
                    s.dedup();
                    assert_eq!(s.len(), k);
                    assert!(s.iter().all(|&i| (i as usize) < e));
                }
            }
        }
    }
}

#[test]
fn half_logits_route_like_their_f32_values() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let (t, e, k) = (9, 128, 8);
    let x: Vec<f32> = (0..t * e).map(|_| rng.random_range(-4.0f32..4.0)).collect();
    for kind in all_kinds(&mut rng, e) {
        let cfg = RouterConfig {
            kind,
            n_experts: e,
            top_k: k,
        };
        for dtype in [DType::F16, DType::Bf16] {
            let h = Tensor::from_f32(&x, &[t, e], dtype).expect("t");
            let f = h.to_dtype(DType::F32).expect("f32");
            let (a, b) = (
                route(&h, &cfg).expect("half"),
                route(&f, &cfg).expect("f32"),
            );
            assert_eq!(
                a.ids.as_slice::<u32>().expect("i"),
                b.ids.as_slice::<u32>().expect("i")
            );
            assert_eq!(
                a.weights.as_slice::<f32>().expect("w"),
                b.weights.as_slice::<f32>().expect("w")
            );
        }
    }
}

fn grouped(n_group: usize, topk_group: usize) -> RouterKind {
    RouterKind::Grouped {
        scoring: Scoring::Sigmoid,
        bias: None,
        n_group,
        topk_group,
        dropped_groups: GroupMask::Zero,
        norm_topk_prob: true,
        routed_scaling_factor: 1.0,
    }
}

#[test]
fn rejects_invalid_arguments() {
    let logits = Tensor::from_f32(&[0.5; 3 * 8], &[3, 8], DType::F32).expect("t");
    let ok = RouterConfig {
        kind: RouterKind::TopKSoftmax,
        n_experts: 8,
        top_k: 2,
    };
    assert!(route(&logits, &ok).is_ok());
    let with = |kind: RouterKind, e: usize, k: usize| RouterConfig {
        kind,
        n_experts: e,
        top_k: k,
    };
    let bad: Vec<(RouterConfig, Tensor, &str)> = vec![
        (
            with(RouterKind::TopKSoftmax, 16, 2),
            logits.clone(),
            "logits",
        ),
        (
            ok.clone(),
            Tensor::from_f32(&[0.0; 8], &[8], DType::F32).expect("t"),
            "logits",
        ),
        (
            ok.clone(),
            Tensor::from_slice(&[0u32; 24], &[3, 8]).expect("t"),
            "logits",
        ),
        (
            ok.clone(),
            Tensor::from_f32(&[0.0; 24], &[1, 3, 8], DType::F32).expect("t"),
            "logits",
        ),
        (
            with(RouterKind::TopKSoftmax, 0, 1),
            Tensor::zeros(DType::F32, &[3, 0]),
            "cfg.n_experts",
        ),
        (
            with(RouterKind::TopKSoftmax, 2048, 2),
            Tensor::zeros(DType::F32, &[1, 2048]),
            "cfg.n_experts",
        ),
        (
            with(RouterKind::TopKSoftmax, 8, 0),
            logits.clone(),
            "cfg.top_k",
        ),
        (
            with(RouterKind::TopKSoftmax, 8, 9),
            logits.clone(),
            "cfg.top_k",
        ),
        (
            with(RouterKind::TopKSoftmax, 64, 33),
            Tensor::zeros(DType::F32, &[1, 64]),
            "cfg.top_k",
        ),
        (
            with(
                RouterKind::Gemma4 {
                    per_expert_scale: vec![1.0; 7],
                },
                8,
                2,
            ),
            logits.clone(),
            "cfg.kind.per_expert_scale",
        ),
        (
            with(
                RouterKind::Grouped {
                    scoring: Scoring::Sigmoid,
                    bias: Some(vec![0.0; 9]),
                    n_group: 1,
                    topk_group: 1,
                    dropped_groups: GroupMask::Zero,
                    norm_topk_prob: true,
                    routed_scaling_factor: 1.0,
                },
                8,
                2,
            ),
            logits.clone(),
            "cfg.kind.bias",
        ),
        (
            with(grouped(3, 1), 8, 2),
            logits.clone(),
            "cfg.kind.n_group",
        ),
        (
            with(grouped(0, 1), 8, 2),
            logits.clone(),
            "cfg.kind.n_group",
        ),
        (
            with(grouped(4, 0), 8, 2),
            logits.clone(),
            "cfg.kind.topk_group",
        ),
        (
            with(grouped(4, 5), 8, 2),
            logits.clone(),
            "cfg.kind.topk_group",
        ),
        (with(grouped(4, 1), 8, 3), logits.clone(), "cfg.top_k"),
        (
            with(
                RouterKind::Grouped {
                    scoring: Scoring::Softmax,
                    bias: None,
                    n_group: 1,
                    topk_group: 1,
                    dropped_groups: GroupMask::Zero,
                    norm_topk_prob: false,
                    routed_scaling_factor: f32::NAN,
                },
                8,
                2,
            ),
            logits.clone(),
            "cfg.kind.routed_scaling_factor",
        ),
        (
            with(
                RouterKind::Grouped {
                    scoring: Scoring::Softmax,
                    bias: None,
                    n_group: 1,
                    topk_group: 1,
                    dropped_groups: GroupMask::Zero,
                    norm_topk_prob: false,
                    routed_scaling_factor: f32::INFINITY,
                },
                8,
                2,
            ),
            logits.clone(),
            "cfg.kind.routed_scaling_factor",
        ),
    ];
    for (cfg, x, arg) in bad {
        for backend in [Backend::CpuReference, Backend::CpuFast] {
            let err = route_on(backend, &x, &cfg)
                .expect_err("must be rejected")
                .to_string();
            assert!(
                err.starts_with("route: argument `") && err.contains(&format!("`{arg}`")),
                "{arg}: {err}"
            );
            assert!(err.contains("expected") && err.contains("got"), "{err}");
        }
    }
    // The limits themselves are accepted.
    assert!(route(
        &Tensor::zeros(DType::F32, &[1, 1024]),
        &with(RouterKind::TopKSoftmax, 1024, 32)
    )
    .is_ok());
    assert!(route(&logits, &with(grouped(4, 1), 8, 2)).is_ok());
}

#[test]
fn grouped_slot_order_and_masked_groups_by_hand() {
    // Groups of 2: {0,1} {2,3} {4,5} {6,7}; sigmoid scores.
    let l = [2.0f32, -1.0, 0.5, 0.4, 3.0, -3.0, 0.0, 0.1];
    let s: Vec<f64> = l
        .iter()
        .map(|&x| 1.0 / (1.0 + (-(x as f64)).exp()))
        .collect();
    let logits = Tensor::from_f32(&l, &[1, 8], DType::F32).expect("t");
    let kind = |b: f32, dropped_groups| RouterKind::Grouped {
        scoring: Scoring::Sigmoid,
        bias: Some(vec![b; 8]),
        n_group: 4,
        topk_group: 2,
        dropped_groups,
        norm_topk_prob: true,
        routed_scaling_factor: 2.0,
    };
    // bias 0: group scores (top-2 sums) 1.150, 1.221, 1.000, 1.025 → keep groups 1, 0;
    // expert 4 (the best score) is dropped with its group. Slots by descending score.
    // bias -0.7: all kept keys but expert 0's are negative, so with GroupMask::Zero
    // the dropped groups' zeroed keys win next, lowest index first (mlx-lm's
    // put_along_axis(.., 0.0)); with GroupMask::NegInf (llama.cpp) the kept
    // experts win whatever their sign.
    for (b, mask, ids) in [
        (0.0, GroupMask::Zero, [0u32, 2, 3]),
        (0.0, GroupMask::NegInf, [0, 2, 3]),
        (-0.7, GroupMask::Zero, [0, 4, 5]),
        (-0.7, GroupMask::NegInf, [0, 2, 3]),
    ] {
        let cfg = RouterConfig {
            kind: kind(b, mask),
            n_experts: 8,
            top_k: 3,
        };
        for backend in [Backend::CpuReference, Backend::CpuFast] {
            let r = route_on(backend, &logits, &cfg).expect("route");
            assert_eq!(
                r.ids.as_slice::<u32>().expect("ids"),
                &ids,
                "bias {b} {mask:?}"
            );
            let sum: f64 = ids.iter().map(|&e| s[e as usize]).sum();
            let want: Vec<f32> = ids
                .iter()
                .map(|&e| (2.0 * s[e as usize] / sum) as f32)
                .collect();
            let e = nmse(r.weights.as_slice::<f32>().expect("w"), &want);
            assert!(e <= NMSE_MAX, "bias {b}: NMSE {e:e}");
        }
    }
}

/// The fixtures' llama.cpp cases (`dropped_groups: "neg_inf"`, oracle: the
/// numpy transcription of `build_moe_ffn`, checked against moekit with
/// `GroupMask::NegInf` by `matches_mlx_lm_gate_code`) routed with the other
/// mask, `GroupMask::Zero`, give the mlx-lm rule's experts (`_zero_ids.npy`),
/// which differ from llama.cpp's exactly on the rows listed in `differ_rows`.
#[test]
fn llama_cpp_cases_differ_from_the_zero_mask_where_listed() {
    let dir = fixtures();
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).expect("cases.json"))
            .expect("json");
    let mut seen = 0;
    for c in cases.as_array().expect("list") {
        if c["dropped_groups"].as_str() != Some("neg_inf") {
            continue;
        }
        seen += 1;
        let name = c["name"].as_str().expect("name");
        let inf = config(c);
        let RouterKind::Grouped {
            dropped_groups: GroupMask::NegInf,
            ..
        } = inf.kind
        else {
            panic!("{name}: {:?}", inf.kind)
        };
        let mut zero = inf.clone();
        if let RouterKind::Grouped { dropped_groups, .. } = &mut zero.kind {
            *dropped_groups = GroupMask::Zero;
        }
        let logits = NpyArray::read(dir.join(format!("{name}_logits.npy")))
            .expect("logits")
            .to_tensor()
            .expect("tensor");
        let read_ids = |suffix: &str| {
            NpyArray::read(dir.join(format!("{name}_{suffix}.npy")))
                .expect("ids")
                .to_u32()
                .expect("u32")
        };
        let (want_inf, want_zero) = (read_ids("ids"), read_ids("zero_ids"));
        let k = inf.top_k;
        let differ: Vec<usize> = c["differ_rows"]
            .as_array()
            .expect("differ_rows")
            .iter()
            .map(|v| v.as_u64().expect("row") as usize)
            .collect();
        assert!(!differ.is_empty(), "{name}: no row where the masks differ");
        for backend in [Backend::CpuReference, Backend::CpuFast] {
            let ids = |cfg: &RouterConfig| {
                let r = route_on(backend, &logits, cfg).expect("route");
                by_id(
                    r.ids.as_slice::<u32>().expect("ids"),
                    r.weights.as_slice::<f32>().expect("w"),
                    k,
                )
                .0
            };
            let (got_inf, got_zero) = (ids(&inf), ids(&zero));
            assert_eq!(got_inf, want_inf, "{name} {backend:?}: NegInf ids");
            assert_eq!(got_zero, want_zero, "{name} {backend:?}: Zero ids");
            let rows: Vec<usize> = got_inf
                .chunks(k)
                .zip(got_zero.chunks(k))
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .map(|(t, _)| t)
                .collect();
            assert_eq!(
                rows, differ,
                "{name} {backend:?}: rows where the masks differ"
            );
        }
    }
    assert!(seen >= 2, "expected the llama.cpp cases, found {seen}");
}

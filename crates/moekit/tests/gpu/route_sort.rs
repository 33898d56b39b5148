//! Routing and the expert sort on the GPU vs the CPU reference.
//!
//! Routing: ids exactly equal; weights within NMSE 1e-12 and 2e-6 relative
//! per element. The kernels do the CPU's f32 operations in the CPU's order,
//! but their exp is correctly rounded where libm's expf is off by one ulp on
//! ~7e-5 of inputs, so a weight may differ by a few ulp, and the grouped
//! router (which selects on exp-derived scores) may swap two experts whose
//! keys are within an ulp: such a token is accepted only if every swapped
//! pair's keys (recomputed in f64) differ by ≤ 1e-6, and on ≤ 1% of tokens.
//! Sort: offsets, sorted and inverse bit-exact.

use crate::common::*;
use moekit::ops::route::{route_on, GroupMask, RouterConfig, RouterKind, Routing, Scoring};
use moekit::ops::sort::{expert_sort_on, ExpertSort};
use moekit::testing::cuda::route::route_into;
use moekit::testing::cuda::sort::expert_sort_into;
use moekit::{Backend, DType, Device, Tensor};
use rand::Rng;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];
/// Weights: NMSE bound (f32 outputs of f32 math, ulp-level differences).
const W_NMSE: f64 = 1e-12;
/// Weights: relative bound per element.
const W_REL: f32 = 2e-6;

fn cfg(n_experts: usize, top_k: usize, kind: RouterKind) -> RouterConfig {
    RouterConfig {
        kind,
        n_experts,
        top_k,
    }
}

fn uniform(n: usize, lo: f32, hi: f32, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    (0..n).map(|_| lo + (hi - lo) * r.random::<f32>()).collect()
}

fn grouped(
    scoring: Scoring,
    bias: Option<Vec<f32>>,
    groups: (usize, usize),
    norm: bool,
    rsf: f32,
) -> RouterKind {
    RouterKind::Grouped {
        scoring,
        bias,
        n_group: groups.0,
        topk_group: groups.1,
        dropped_groups: GroupMask::Zero,
        norm_topk_prob: norm,
        routed_scaling_factor: rsf,
    }
}

/// `kind` with the dropped groups' keys −∞ (llama.cpp) instead of 0.0.
fn neg_inf(kind: RouterKind) -> RouterKind {
    match kind {
        RouterKind::Grouped {
            scoring,
            bias,
            n_group,
            topk_group,
            norm_topk_prob,
            routed_scaling_factor,
            ..
        } => RouterKind::Grouped {
            scoring,
            bias,
            n_group,
            topk_group,
            dropped_groups: GroupMask::NegInf,
            norm_topk_prob,
            routed_scaling_factor,
        },
        other => other,
    }
}

/// One config of every rule and family shape, plus edge cases.
fn configs() -> Vec<(&'static str, RouterConfig)> {
    use RouterKind::*;
    use Scoring::*;
    vec![
        ("mixtral", cfg(8, 2, TopKSoftmax)),
        ("gpt-oss", cfg(32, 4, TopKSoftmax)),
        (
            "qwen3",
            cfg(
                128,
                8,
                SoftmaxTopK {
                    norm_topk_prob: true,
                },
            ),
        ),
        (
            "qwen2 E=60",
            cfg(
                60,
                4,
                SoftmaxTopK {
                    norm_topk_prob: false,
                },
            ),
        ),
        (
            "E=1 k=1 renorm",
            cfg(
                1,
                1,
                SoftmaxTopK {
                    norm_topk_prob: true,
                },
            ),
        ),
        (
            "gemma4",
            cfg(
                128,
                8,
                Gemma4 {
                    per_expert_scale: uniform(128, 0.5, 1.5, 11),
                },
            ),
        ),
        (
            "deepseek-v3",
            cfg(
                256,
                8,
                grouped(
                    Sigmoid,
                    Some(uniform(256, -0.05, 0.05, 12)),
                    (8, 4),
                    true,
                    2.5,
                ),
            ),
        ),
        (
            "deepseek-v2",
            cfg(160, 6, grouped(Softmax, None, (8, 3), false, 16.0)),
        ),
        (
            "v2-lite greedy",
            cfg(64, 6, grouped(Softmax, None, (1, 1), true, 1.0)),
        ),
        (
            "grouped k=1",
            cfg(
                16,
                1,
                grouped(Sigmoid, Some(uniform(16, -0.1, 0.1, 13)), (4, 2), true, 1.5),
            ),
        ),
        (
            "groups of one",
            cfg(
                32,
                4,
                grouped(
                    Sigmoid,
                    Some(uniform(32, -0.1, 0.1, 14)),
                    (32, 8),
                    true,
                    1.0,
                ),
            ),
        ),
        // Negative keys in kept groups: masked experts (key 0.0) win, as in mlx-lm.
        (
            "masked-zero quirk",
            cfg(
                64,
                4,
                grouped(
                    Sigmoid,
                    Some(uniform(64, -2.0, -1.9, 15)),
                    (8, 2),
                    false,
                    1.0,
                ),
            ),
        ),
        // The same with llama.cpp's −∞: only kept experts are chosen.
        (
            "masked -inf (llama.cpp)",
            cfg(
                64,
                4,
                neg_inf(grouped(
                    Sigmoid,
                    Some(uniform(64, -2.0, -1.9, 15)),
                    (8, 2),
                    false,
                    1.0,
                )),
            ),
        ),
        // DeepSeek-V3's shape with negative biases of mixed effect, −∞ masking.
        (
            "deepseek-v3 -inf, negative bias",
            cfg(
                256,
                8,
                neg_inf(grouped(
                    Sigmoid,
                    Some(uniform(256, -0.9, -0.3, 16)),
                    (8, 4),
                    true,
                    2.5,
                )),
            ),
        ),
        (
            "grouped softmax -inf",
            cfg(
                160,
                6,
                neg_inf(grouped(
                    Softmax,
                    Some(uniform(160, -0.02, 0.0, 17)),
                    (8, 3),
                    true,
                    1.0,
                )),
            ),
        ),
    ]
}

/// Every rule at the largest size, E = 1024, k = 32.
fn configs_1024() -> Vec<(&'static str, RouterConfig)> {
    use RouterKind::*;
    use Scoring::*;
    let (e, k) = (1024, 32);
    vec![
        (
            "1024 softmax-topk",
            cfg(
                e,
                k,
                SoftmaxTopK {
                    norm_topk_prob: true,
                },
            ),
        ),
        ("1024 topk-softmax", cfg(e, k, TopKSoftmax)),
        (
            "1024 gemma4",
            cfg(
                e,
                k,
                Gemma4 {
                    per_expert_scale: uniform(e, 0.5, 1.5, 21),
                },
            ),
        ),
        (
            "1024 grouped softmax",
            cfg(e, k, grouped(Softmax, None, (16, 4), true, 2.0)),
        ),
        (
            "1024 grouped sigmoid",
            cfg(
                e,
                k,
                grouped(
                    Sigmoid,
                    Some(uniform(e, -0.05, 0.05, 22)),
                    (32, 8),
                    true,
                    2.5,
                ),
            ),
        ),
        (
            "1024 grouped sigmoid -inf, negative bias",
            cfg(
                e,
                k,
                neg_inf(grouped(
                    Sigmoid,
                    Some(uniform(e, -0.8, -0.4, 23)),
                    (32, 8),
                    true,
                    2.5,
                )),
            ),
        ),
    ]
}

/// The grouped router's selection keys s + bias (unmasked), in f64.
fn grouped_keys_f64(row: &[f32], kind: &RouterKind) -> Vec<f64> {
    let RouterKind::Grouped { scoring, bias, .. } = kind else {
        return Vec::new();
    };
    let l: Vec<f64> = row.iter().map(|&v| v as f64).collect();
    let s: Vec<f64> = match scoring {
        Scoring::Sigmoid => l.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
        Scoring::Softmax => {
            let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = l.iter().map(|&x| (x - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.iter().map(|&x| x / sum).collect()
        }
    };
    match bias {
        Some(b) => s.iter().zip(b).map(|(&s, &b)| s + b as f64).collect(),
        None => s,
    }
}

/// Routes `logits` (CPU) on the GPU into poisoned outputs and on the CPU
/// reference; returns (gpu ids, gpu weights, cpu ids, cpu weights).
fn both(logits: &Tensor, c: &RouterConfig) -> (Vec<u32>, Vec<f32>, Vec<u32>, Vec<f32>) {
    let want = route_on(Backend::CpuReference, logits, c).unwrap();
    let (t, k) = (logits.shape()[0], c.top_k);
    let out = Routing {
        ids: poisoned(&[t, k], DType::U32),
        weights: poisoned(&[t, k], DType::F32),
    };
    route_into(&logits.to_device(gpu()).unwrap(), c, &out).unwrap();
    let ids = out
        .ids
        .to_device(Device::Cpu)
        .unwrap()
        .as_slice::<u32>()
        .unwrap()
        .to_vec();
    let w = out
        .weights
        .to_device(Device::Cpu)
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
        .to_vec();
    (
        ids,
        w,
        want.ids.as_slice::<u32>().unwrap().to_vec(),
        want.weights.as_slice::<f32>().unwrap().to_vec(),
    )
}

/// Compares a GPU routing with the CPU reference (see the module doc);
/// returns the number of bit-identical weights.
fn check_route(logits: &Tensor, c: &RouterConfig, what: &str) -> usize {
    let (ids, w, want_ids, want_w) = both(logits, c);
    let (t, k, e) = (logits.shape()[0], c.top_k, c.n_experts);
    let rows = logits.to_f32_vec().unwrap();
    let (mut gw, mut ww, mut swapped) = (Vec::new(), Vec::new(), 0usize);
    for tok in 0..t {
        let (g, want) = (
            &ids[tok * k..(tok + 1) * k],
            &want_ids[tok * k..(tok + 1) * k],
        );
        if g == want {
            gw.extend_from_slice(&w[tok * k..(tok + 1) * k]);
            ww.extend_from_slice(&want_w[tok * k..(tok + 1) * k]);
            continue;
        }
        let q = grouped_keys_f64(&rows[tok * e..(tok + 1) * e], &c.kind);
        assert!(
            !q.is_empty(),
            "{what}: token {tok}: ids {g:?}, cpu {want:?}"
        );
        for (&a, &b) in g.iter().zip(want).filter(|(a, b)| a != b) {
            let near = (a as usize) < e && (q[a as usize] - q[b as usize]).abs() <= 1e-6;
            assert!(
                near,
                "{what}: token {tok}: ids {g:?}, cpu {want:?} (expert {a} vs {b}: not a near tie)"
            );
        }
        swapped += 1;
    }
    assert!(
        swapped * 100 <= t.max(100),
        "{what}: {swapped} of {t} tokens with near-tie swaps"
    );
    let err = nmse(&gw, &ww);
    assert!(err <= W_NMSE, "{what}: weights NMSE {err:e}");
    for (i, (&a, &b)) in gw.iter().zip(&ww).enumerate() {
        assert!(
            (a - b).abs() <= W_REL * b.abs(),
            "{what}: weight {i}: {a:e} vs cpu {b:e}"
        );
    }
    gw.iter()
        .zip(&ww)
        .filter(|(a, b)| a.to_bits() == b.to_bits())
        .count()
}

fn run_configs(list: Vec<(&'static str, RouterConfig)>, seed: u64) {
    let (mut exact, mut total) = (0, 0);
    for (name, c) in &list {
        for &t in &TOKENS {
            for dt in DTYPES {
                // Logits in [-4, 4): a realistic spread; f16/bf16 rounding adds exact ties.
                let x: Vec<f32> = random(&[t, c.n_experts], DType::F32, seed + t as u64)
                    .to_f32_vec()
                    .unwrap()
                    .iter()
                    .map(|v| 4.0 * v)
                    .collect();
                let logits = Tensor::from_f32(&x, &[t, c.n_experts], dt).unwrap();
                exact += check_route(&logits, c, &format!("{name} T={t} {dt}"));
                total += t * c.top_k;
            }
        }
    }
    eprintln!("route: {exact} of {total} weights bit-identical to the CPU reference");
}

#[test]
fn route_matches_cpu_every_kind_dtype_and_size() {
    run_configs(configs(), 100);
}

#[test]
fn route_matches_cpu_at_1024_experts_top_32() {
    run_configs(configs_1024(), 200);
}

#[test]
fn route_exact_ties_pick_the_lower_index() {
    // Values from a small set (exact in f16/bf16, incl. -0.0 == 0.0): most
    // keys tie, so selection order is decided by the tie-break alone.
    let set = [-1.0f32, -0.5, -0.0, 0.0, 0.5, 1.0];
    for (name, c) in configs().into_iter().chain(configs_1024()) {
        for t in [1, 64, 333] {
            let mut r = rng(t as u64);
            let x: Vec<f32> = (0..t * c.n_experts)
                .map(|_| set[r.random_range(0..set.len())])
                .collect();
            for dt in DTYPES {
                let logits = Tensor::from_f32(&x, &[t, c.n_experts], dt).unwrap();
                check_route(&logits, &c, &format!("ties {name} T={t} {dt}"));
            }
        }
    }
}

#[test]
fn route_one_share_holding_the_best_keys() {
    // Experts ≡ 5 (mod 32) outrank every other: one lane of the selecting
    // warp wins every round, past the end of its sorted register list
    // (8 keys) where E > 256 and k > 8 (E = 1024, k = 32).
    for (name, c) in configs().into_iter().chain(configs_1024()) {
        let (t, e) = (8, c.n_experts);
        let x: Vec<f32> = random(&[t, e], DType::F32, 77)
            .to_f32_vec()
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, v)| if (i % e) % 32 == 5 { 8.0 + v } else { *v })
            .collect();
        for dt in DTYPES {
            let logits = Tensor::from_f32(&x, &[t, e], dt).unwrap();
            check_route(&logits, &c, &format!("one share {name} {dt}"));
        }
    }
}

#[test]
fn route_special_values_match_cpu() {
    // NaN ranks last, -inf, signed zeros: ids exact, weights equal or both NaN.
    let set = [f32::NAN, f32::NEG_INFINITY, -0.0, 0.0, 1.0, -1.0, 2.0];
    for (name, c) in configs() {
        let t = 64;
        let mut r = rng(7);
        let x: Vec<f32> = (0..t * c.n_experts)
            .map(|_| set[r.random_range(0..set.len())])
            .collect();
        for dt in DTYPES {
            let logits = Tensor::from_f32(&x, &[t, c.n_experts], dt).unwrap();
            let (ids, w, want_ids, want_w) = both(&logits, &c);
            assert_eq!(ids, want_ids, "special {name} {dt}: ids");
            for (i, (&a, &b)) in w.iter().zip(&want_w).enumerate() {
                let same = a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= W_REL * b.abs();
                assert!(same, "special {name} {dt}: weight {i}: {a:e} vs cpu {b:e}");
            }
        }
    }
}

#[test]
fn route_dropped_group_masks_match_cpu_and_differ() {
    // Kept keys of both signs, mostly negative (bias -2.0..-0.6, sigmoid in
    // (0, 1)): the masks of dropped groups (0.0 as mlx-lm, −∞ as llama.cpp)
    // choose different experts on many tokens (153 of 256 on the CPU
    // reference; with bias -0.9..-0.3 the top 6 of the 24 kept experts are
    // positive on every token and the masks never differ); each rule's GPU
    // routing (standalone kernel) equals its CPU reference.
    let (t, e, k) = (256, 64, 6);
    let bias = uniform(e, -2.0, -0.6, 41);
    let zero = cfg(
        e,
        k,
        grouped(Scoring::Sigmoid, Some(bias), (8, 3), true, 2.5),
    );
    let inf = cfg(e, k, neg_inf(zero.kind.clone()));
    let x: Vec<f32> = random(&[t, e], DType::F32, 42)
        .to_f32_vec()
        .unwrap()
        .iter()
        .map(|v| 4.0 * v)
        .collect();
    let mut cpu_ids = Vec::new();
    for c in [&zero, &inf] {
        for dt in DTYPES {
            let logits = Tensor::from_f32(&x, &[t, e], dt).unwrap();
            check_route(&logits, c, &format!("{:?} {dt}", c.kind));
        }
        let logits = Tensor::from_f32(&x, &[t, e], DType::F32).unwrap();
        let r = route_on(Backend::CpuReference, &logits, c).unwrap();
        cpu_ids.push(r.ids.as_slice::<u32>().unwrap().to_vec());
    }
    let differ = cpu_ids[0]
        .chunks(k)
        .zip(cpu_ids[1].chunks(k))
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        differ >= t / 8,
        "the masks differ on only {differ} of {t} tokens"
    );
}

#[test]
fn route_front_end_per_expert_vectors_and_errors() {
    let dev = gpu();
    // Two different scale vectors for the same shape: the device copy is
    // keyed by values, so each call must use its own.
    for seed in [31, 32, 31] {
        let c = cfg(
            64,
            4,
            RouterKind::Gemma4 {
                per_expert_scale: uniform(64, 0.0, 2.0, seed),
            },
        );
        let logits = random(&[33, 64], DType::Bf16, seed);
        let want = route_on(Backend::CpuReference, &logits, &c).unwrap();
        let got = route_on(Backend::Cuda, &logits.to_device(dev).unwrap(), &c).unwrap();
        assert_eq!(got.ids.device(), dev);
        let ids = got.ids.to_device(Device::Cpu).unwrap();
        assert_eq!(
            ids.as_slice::<u32>().unwrap(),
            want.ids.as_slice::<u32>().unwrap(),
            "gemma4 seed {seed}"
        );
        let err = nmse(
            &host_f32(&got.weights),
            want.weights.as_slice::<f32>().unwrap(),
        );
        assert!(err <= W_NMSE, "gemma4 seed {seed}: NMSE {err:e}");
    }
    // T = 0: nothing to launch, empty outputs.
    let c = cfg(8, 2, RouterKind::TopKSoftmax);
    let empty = route_on(
        Backend::Cuda,
        &Tensor::zeros_on(DType::F32, &[0, 8], dev).unwrap(),
        &c,
    )
    .unwrap();
    assert_eq!(empty.ids.shape(), &[0, 2]);
    // Argument errors are errors, not launches.
    let logits = random(&[4, 8], DType::F32, 1);
    assert!(
        route_on(Backend::Cuda, &logits, &c).is_err(),
        "host logits on the CUDA backend"
    );
    let ld = logits.to_device(dev).unwrap();
    let bad = Routing {
        ids: poisoned(&[4, 3], DType::U32),
        weights: poisoned(&[4, 2], DType::F32),
    };
    assert!(route_into(&ld, &c, &bad).is_err(), "ids of the wrong shape");
    let bad = Routing {
        ids: poisoned(&[4, 2], DType::U32),
        weights: poisoned(&[4, 2], DType::F16),
    };
    assert!(
        route_into(&ld, &c, &bad).is_err(),
        "weights of the wrong dtype"
    );
    assert!(
        route_into(&ld, &cfg(9, 2, RouterKind::TopKSoftmax), &bad).is_err(),
        "E mismatch"
    );
}

fn poisoned_sort(t: usize, k: usize, e: usize) -> ExpertSort {
    ExpertSort {
        offsets: poisoned(&[e + 1], DType::U32),
        sorted: poisoned(&[t * k], DType::U32),
        inverse: poisoned(&[t * k], DType::U32),
        n_experts: e,
        top_k: k,
    }
}

fn host_u32(t: &Tensor) -> Vec<u32> {
    t.to_device(Device::Cpu)
        .unwrap()
        .as_slice::<u32>()
        .unwrap()
        .to_vec()
}

#[test]
fn sort_matches_cpu_exactly() {
    let dev = gpu();
    // Every T × k ∈ {1, 8, 32}, plus both sides of the one-block limit (1024
    // slots) and of 4096 slots (four ranges).
    let mut shapes: Vec<(usize, usize)> = TOKENS
        .iter()
        .flat_map(|&t| [(t, 1), (t, 8), (t, 32)])
        .collect();
    shapes.extend([
        (1024, 1),
        (1025, 1),
        (128, 8),
        (129, 8),
        (4096, 1),
        (4097, 1),
        (512, 8),
        (513, 8),
    ]);
    for &(t, k) in &shapes {
        for e in [1usize, 8, 128, 1024] {
            for all_on_one in [false, true] {
                let mut r = rng((t * 31 + k * 7 + e) as u64);
                let one = r.random_range(0..e as u32);
                let ids: Vec<u32> = (0..t * k)
                    .map(|_| {
                        if all_on_one {
                            one
                        } else {
                            r.random_range(0..e as u32)
                        }
                    })
                    .collect();
                let ids = Tensor::from_slice(&ids, &[t, k]).unwrap();
                let want = expert_sort_on(Backend::CpuReference, &ids, e).unwrap();
                let out = poisoned_sort(t, k, e);
                expert_sort_into(&ids.to_device(dev).unwrap(), e, &out).unwrap();
                let what = format!("T={t} k={k} E={e} all_on_one={all_on_one}");
                assert_eq!(
                    host_u32(&out.offsets),
                    want.offsets.as_slice::<u32>().unwrap(),
                    "{what}: offsets"
                );
                assert_eq!(
                    host_u32(&out.sorted),
                    want.sorted.as_slice::<u32>().unwrap(),
                    "{what}: sorted"
                );
                assert_eq!(
                    host_u32(&out.inverse),
                    want.inverse.as_slice::<u32>().unwrap(),
                    "{what}: inverse"
                );
            }
        }
    }
    // The front end's allocating path, and T = 0 (offsets all zero).
    let ids = Tensor::from_slice(&[2u32, 0, 0, 2, 1, 0], &[3, 2]).unwrap();
    let s = expert_sort_on(Backend::Cuda, &ids.to_device(dev).unwrap(), 4).unwrap();
    assert_eq!(host_u32(&s.offsets), [0, 3, 4, 6, 6]);
    assert_eq!(host_u32(&s.sorted), [1, 2, 5, 4, 0, 3]);
    assert_eq!(host_u32(&s.inverse), [4, 0, 1, 5, 3, 2]);
    let out = poisoned_sort(0, 4, 8);
    expert_sort_into(
        &Tensor::zeros_on(DType::U32, &[0, 4], dev).unwrap(),
        8,
        &out,
    )
    .unwrap();
    assert_eq!(host_u32(&out.offsets), [0u32; 9]);
    assert!(
        expert_sort_on(Backend::Cuda, &ids, 4).is_err(),
        "host ids on the CUDA backend"
    );
}

#[test]
fn sort_out_of_range_ids_are_reported_and_contained() {
    let dev = gpu();
    let e = 16usize;
    // One-block path (6 slots) and the multi-range path (5600 slots).
    for (t, k) in [(3usize, 2usize), (700, 8)] {
        let n = t * k;
        let mut r = rng(n as u64);
        let mut ids: Vec<u32> = (0..n).map(|_| r.random_range(0..e as u32)).collect();
        ids[1] = e as u32;
        ids[n / 2] = e as u32 + 100;
        ids[n - 1] = u32::MAX;
        let ids_gpu = Tensor::from_slice(&ids, &[t, k])
            .unwrap()
            .to_device(dev)
            .unwrap();
        let out = poisoned_sort(t, k, e);
        expert_sort_into(&ids_gpu, e, &out).unwrap();
        let err = out.offsets.to_device(Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("expert id"), "T={t} k={k}: {err}");
        // Reported once; the layout is the documented one: invalid slots form a
        // virtual expert E after the real ones, outside offsets[E].
        let key = |s: usize| (ids[s] as usize).min(e);
        let mut want_sorted: Vec<u32> = (0..n as u32).collect();
        want_sorted.sort_by_key(|&s| (key(s as usize), s));
        let want_offsets: Vec<u32> = (0..=e)
            .map(|x| (0..n).filter(|&s| key(s) < x).count() as u32)
            .collect();
        let mut want_inverse = vec![0u32; n];
        for (p, &s) in want_sorted.iter().enumerate() {
            want_inverse[s as usize] = p as u32;
        }
        assert_eq!(host_u32(&out.offsets), want_offsets, "T={t} k={k}: offsets");
        assert_eq!(host_u32(&out.sorted), want_sorted, "T={t} k={k}: sorted");
        assert_eq!(host_u32(&out.inverse), want_inverse, "T={t} k={k}: inverse");
        // Through the front end too: no host check, the device reports.
        let s = expert_sort_on(Backend::Cuda, &ids_gpu, e).unwrap();
        let err = s.sorted.to_device(Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("expert id"), "front end T={t} k={k}: {err}");
    }
}

//! The fast CPU backend's quantized-activation path (`ActMode::Q8`, the
//! default for weight formats with integer kernels): which path a call
//! takes and why, and that its results are deterministic: a token's result
//! does not depend on the other tokens of the batch, nor on the number of
//! threads (bit for bit), at the op and at the MoE-block level.

mod common_util;
use common_util::{fixture, rng};
use moekit::cpu::{act_mode, with_act_mode, ActMode, ACT_ENV};
use moekit::format::random::random_weights;
use moekit::format::GgmlType;
use moekit::load::gguf::GgufCheckpoint;
use moekit::load::Checkpoint;
use moekit::ops::act::{gather_swiglu_on, GateUp};
use moekit::ops::gather_mm::{gather_mm_on, RowExperts};
use moekit::testing::cpu_fast::{act_choice, kind_of_rows, Strategy};
use moekit::testing::decoder;
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};
use rand::Rng;

/// The formats with integer kernels (every GGUF type and MLX affine width).
const Q8_FORMATS: [&str; 16] = [
    "q4_0",
    "q8_0",
    "q4_k",
    "affine4",
    "affine4-g32",
    "affine4-g128",
    "q4_1",
    "q5_0",
    "q5_1",
    "q2_k",
    "q3_k",
    "q5_k",
    "q6_k",
    "affine8",
    "affine2-g32",
    "affine6-g128",
];

/// The formats whose integer kernels run only with `ActMode::Q8`.
const F32_BY_DEFAULT: [&str; 3] = ["q4_1", "affine2-g32", "affine8"];

fn weights(f: &str, e: usize, n: usize, k: usize, seed: u64) -> QuantWeights {
    let f = WeightFormat::parse(f).unwrap();
    random_weights(f, e, n, k, DType::F16, seed, &|| {}).unwrap()
}

fn activations(m: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    (0..m * k).map(|_| r.random::<f32>() * 2.0 - 0.8).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn act_choice_names_the_path_and_why() {
    for name in Q8_FORMATS.iter().chain(&["affine-u8", "bf16", "f32"]) {
        let w = weights(name, 1, 2, 256, 1);
        let kind = kind_of_rows(&decoder(&w).unwrap());
        assert_eq!(kind.is_some(), Q8_FORMATS.contains(name), "{name}");
        for mode in [ActMode::Auto, ActMode::Q8, ActMode::F32] {
            for st in [Strategy::Auto, Strategy::FusedDot, Strategy::DecodeOnce] {
                let c = act_choice(st, mode, &[kind]);
                // Q4_1, affine2 and affine8: the f32 kernels by default.
                let slow = F32_BY_DEFAULT.contains(name);
                assert_eq!(kind.is_some_and(|k| !k.by_default()), slow, "{name}");
                let want = kind.is_some()
                    && mode != ActMode::F32
                    && st != Strategy::DecodeOnce
                    && (mode == ActMode::Q8 || !slow);
                assert_eq!(c.q8, want, "{name} {mode} {st:?}: {}", c.reason);
                let why = match (mode, st, kind) {
                    (ActMode::F32, _, _) => "f32 activations requested",
                    (_, Strategy::DecodeOnce, _) => "DecodeOnce dots dequantized f32 rows",
                    (_, _, None) => "no integer kernels for the weight format",
                    (ActMode::Auto, _, _) if slow => "f32 kernels faster for the weight format",
                    _ => "integer kernels for the weight format",
                };
                assert_eq!(c.reason, why);
            }
        }
    }
    // Two sources (gate and up): q8 only if both have kernels.
    let (a, b) = (
        weights("q4_k", 1, 2, 256, 1),
        weights("affine-u8", 1, 2, 256, 1),
    );
    let kinds = [a, b].map(|w| kind_of_rows(&decoder(&w).unwrap()));
    assert!(!act_choice(Strategy::Auto, ActMode::Auto, &kinds).q8);
    // The process default comes from MOEKIT_CPU_ACT (unset: auto).
    let want = std::env::var(ACT_ENV)
        .ok()
        .and_then(|v| ActMode::parse(v.trim()))
        .unwrap_or(ActMode::Auto);
    assert_eq!(act_mode(), want);
}

/// Row-to-expert ids of `m` tokens over `e` experts: expert 1 gets 9 rows (two
/// groups of 4 and one more), the others a random share.
fn ids(m: usize, e: usize, seed: u64) -> Vec<u32> {
    let mut r = rng(seed);
    (0..m)
        .map(|i| {
            if i % 4 == 1 {
                1
            } else {
                r.random_range(0..e as u32)
            }
        })
        .collect()
}

#[test]
fn a_tokens_result_does_not_depend_on_the_batch() {
    // ActMode::Q8: the integer kernels also of the formats whose default is
    // f32.
    with_act_mode(ActMode::Q8, token_results_do_not_depend_on_the_batch);
}

fn token_results_do_not_depend_on_the_batch() {
    let (e, n, k, m) = (5, 40, 512, 37);
    for f in Q8_FORMATS {
        let w = weights(f, e, n, k, 3);
        let gu = GateUp::separate(weights(f, e, n, k, 4), weights(f, e, n, k, 5)).unwrap();
        let xv = activations(m, k, 6);
        let x = Tensor::from_f32(&xv, &[m, k], DType::F32).unwrap();
        let id = ids(m, e, 7);
        let idt = Tensor::from_slice(&id, &[m]).unwrap();
        let rows = RowExperts::PerRow(&idt);
        let all = gather_mm_on(Backend::CpuFast, &x, &w, rows).unwrap();
        let all_sw = gather_swiglu_on(Backend::CpuFast, &x, &gu, rows).unwrap();
        let (all, all_sw) = (all.to_f32_vec().unwrap(), all_sw.to_f32_vec().unwrap());
        for r in 0..m {
            let xr = Tensor::from_f32(&xv[r * k..(r + 1) * k], &[1, k], DType::F32).unwrap();
            let ir = Tensor::from_slice(&id[r..r + 1], &[1]).unwrap();
            let one = gather_mm_on(Backend::CpuFast, &xr, &w, RowExperts::PerRow(&ir)).unwrap();
            assert_eq!(
                bits(&one.to_f32_vec().unwrap()),
                bits(&all[r * n..(r + 1) * n]),
                "{f}: gather_mm token {r} alone vs in the batch"
            );
            let one = gather_swiglu_on(Backend::CpuFast, &xr, &gu, RowExperts::PerRow(&ir))
                .unwrap()
                .to_f32_vec()
                .unwrap();
            assert_eq!(
                bits(&one),
                bits(&all_sw[r * n..(r + 1) * n]),
                "{f}: gather_swiglu token {r} alone vs in the batch"
            );
        }
        // The f32 path is what the q8 path is measured against: different.
        let f32_all = with_act_mode(ActMode::F32, || {
            gather_mm_on(Backend::CpuFast, &x, &w, rows)
        })
        .unwrap()
        .to_f32_vec()
        .unwrap();
        assert_ne!(bits(&f32_all), bits(&all), "{f}: the q8 path ran");
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let (e, n, k, m) = (6, 300, 768, 23);
    for f in Q8_FORMATS {
        let w = weights(f, e, n, k, 8);
        let x = Tensor::from_f32(&activations(m, k, 9), &[m, k], DType::F32).unwrap();
        let id = ids(m, e, 10);
        let idt = Tensor::from_slice(&id, &[m]).unwrap();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                with_act_mode(ActMode::Q8, || {
                    gather_mm_on(Backend::CpuFast, &x, &w, RowExperts::PerRow(&idt))
                })
            })
            .unwrap()
            .to_f32_vec()
            .unwrap()
        };
        let one = bits(&run(1));
        for threads in [2, 3, 5, 8] {
            assert_eq!(bits(&run(threads)), one, "{f}: {threads} threads vs 1");
        }
    }
}

/// GGUF fixtures' MoE blocks (Q4_0, Q4_K, Q8_0, Q6_K, … experts) on batches of 64
/// tokens: a token's output row is the same in any batch (here: the batch
/// reversed, and the token among 63 other tokens), though its experts'
/// segments change size (≤ 4 rows and more). Batches of more than 4 tokens
/// are compared because the f32 router's `Strategy::Auto` dots a segment
/// of ≤ 4 rows with the fused kernels and a larger one with the
/// dequantize-once ones, which round differently (the f32 path, unchanged
/// here).
#[test]
fn moe_block_outputs_do_not_depend_on_the_batch() {
    for name in ["qwen2moe_q4_0", "qwen3moe_kquant", "glm4moe_q8_0"] {
        let ck = GgufCheckpoint::open(&fixture(&format!("gguf/{name}.gguf"))).unwrap();
        let layer = ck.summary().moe_layers[0];
        let block = ck.moe_block(layer, &|_, _| {}).unwrap();
        let q8 = |w: &QuantWeights| {
            matches!(
                w.format(),
                WeightFormat::Ggml(t) if t != GgmlType::Q4_1
            )
        };
        let gate = match &block.parts().gate_up {
            GateUp::Separate { gate, .. } => gate,
            GateUp::Fused(w) => w,
        };
        assert!(
            q8(&block.parts().down) || q8(gate),
            "{name}: a projection takes the q8 path"
        );
        let h = block.hidden();
        let m = 64;
        let run = |x: &[f32]| {
            let t = Tensor::from_f32(x, &[x.len() / h, h], DType::F32).unwrap();
            block
                .forward_on(Backend::CpuFast, &t)
                .unwrap()
                .out
                .to_f32_vec()
                .unwrap()
        };
        let xv = activations(m, h, 11);
        let all = run(&xv);
        let rev: Vec<f32> = xv.chunks(h).rev().flatten().copied().collect();
        let all_rev = run(&rev);
        for r in 0..m {
            let q = m - 1 - r;
            assert_eq!(
                bits(&all[r * h..(r + 1) * h]),
                bits(&all_rev[q * h..(q + 1) * h]),
                "{name}: token {r} in the batch and reversed"
            );
        }
        for r in [0, 17, 63] {
            let mut other = activations(m, h, 12 + r as u64);
            other[5 * h..6 * h].copy_from_slice(&xv[r * h..(r + 1) * h]);
            let got = run(&other);
            assert_eq!(
                bits(&got[5 * h..6 * h]),
                bits(&all[r * h..(r + 1) * h]),
                "{name}: token {r} among other tokens"
            );
        }
    }
}

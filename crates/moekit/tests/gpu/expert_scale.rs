//! Per-expert output scales (`ExpertFfn::scale`: NVFP4 GGUFs'
//! `ffn_{gate,up,down}_exps.scale`, MLX nvfp4's `global_scale`) on every
//! CUDA path against the CPU reference:
//!
//! * the gate/up epilogues with gate and up scales (with SwiGLU, gpt-oss's
//!   clamped SwiGLU with biases after the scales, and GELU-tanh): the
//!   general path's `gather_glu`, the staged tensor-core `tc_gemm` and the
//!   register-operand `tc_ra` (where it takes the format) and the TMA GEMM
//!   `tc_tma`;
//! * down's scale folded into the combine weights (`combine_weights_on`),
//!   including an expert id out of range, which is reported;
//! * whole blocks with all three scales forced through the general, decode
//!   and tensor-core paths (f32 and bf16 activations; the decode path's
//!   tensor-core and CUDA-core kernels), each against the CPU reference of
//!   the same block, and shown to differ from the block without scales.
//!
//! The fixture checkpoints with scales (`gguf/qwen2moe_nvfp4_scales`,
//! `gguf/gpt_oss_scales_q8_0`, `st/*_nvfp4_gs`) also run in
//! `moe::every_fixture_checkpoint_matches_its_reference_on_cuda` and
//! `moe::family_blocks_match_cpu_on_every_cuda_path`.

use crate::common::*;
use moekit::cpu::{with_act_mode, ActMode};
use moekit::format::random::random_weights;
use moekit::format::{AffineParams, GgmlType, MlxFpMode};
use moekit::moe::{MoeBlock, MoeBlockParts, MoePath, SharedExpert};
use moekit::ops::act::{gather_glu_on, GateUp};
use moekit::ops::ffn::{combine_weights_on, ExpertBiases, ExpertFfn, ExpertScales, GluAct};
use moekit::ops::gather_mm::RowExperts;
use moekit::ops::permute::permute_on;
use moekit::ops::route::{RouterConfig, RouterKind, Routing};
use moekit::testing::cuda::gather_mm::gather_glu_into;
use moekit::testing::cuda::tc_gemm::{glu_into as tc_glu_into, TcRows};
use moekit::testing::cuda::{tc_ra, tc_tma};
use moekit::{Backend, DType, Device, QuantWeights, Tensor, WeightFormat};
use rand::Rng;

const E: usize = 8;
const K: usize = 2;
const H: usize = 256;
const I: usize = 256;

/// The formats every test runs: affine and Q4_K (both on `tc_ra`), the two
/// NVFP4s the scales come with, and dense bf16.
fn formats() -> [WeightFormat; 5] {
    [
        WeightFormat::Affine(AffineParams {
            bits: 4,
            group_size: 64,
        }),
        WeightFormat::Ggml(GgmlType::Q4_K),
        WeightFormat::Ggml(GgmlType::NVFP4),
        WeightFormat::MlxFp(MlxFpMode::Nvfp4),
        WeightFormat::Dense(DType::Bf16),
    ]
}

/// f32 values in [lo, hi) on the CPU.
fn uniform(shape: &[usize], lo: f32, hi: f32, seed: u64) -> Tensor {
    let mut r = rng(seed);
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| lo + (hi - lo) * r.random::<f32>()).collect();
    Tensor::from_f32(&v, shape, DType::F32).unwrap()
}

/// An FFN of `act` with gate, up and down scales in [¼, 4) (so a missing or
/// misplaced one changes the output by far more than rounding) and, for
/// gpt-oss's activation, biases on every projection, wide enough that the
/// clamps act, after the scales.
fn scaled_ffn(act: GluAct, seed: u64) -> ExpertFfn {
    let s = |k: u64| Some(uniform(&[E], 0.25, 4.0, seed + k));
    let bias = match act {
        GluAct::SwiGluOai { .. } => ExpertBiases {
            router: Some(uniform(&[E], -0.5, 0.5, seed + 10)),
            gate: Some(uniform(&[E, I], -4.0, 4.0, seed + 11)),
            up: Some(uniform(&[E, I], -4.0, 4.0, seed + 12)),
            down: Some(uniform(&[E, H], -0.5, 0.5, seed + 13)),
        },
        _ => ExpertBiases::default(),
    };
    ExpertFfn {
        act,
        bias,
        scale: ExpertScales {
            gate: s(1),
            up: s(2),
            down: s(3),
        },
        input: Default::default(),
    }
}

const ACTS: [GluAct; 3] = [GluAct::SwiGlu, GluAct::GPT_OSS, GluAct::GeluTanh];

fn weights(f: WeightFormat, e: usize, n: usize, k: usize, seed: u64) -> QuantWeights {
    random_weights(f, e, n, k, DType::Bf16, seed, &|| {}).unwrap()
}

fn gate_up_on_gpu(gu: &GateUp) -> GateUp {
    match gu {
        GateUp::Separate { gate, up } => {
            GateUp::separate(gate.to_device(gpu()).unwrap(), up.to_device(gpu()).unwrap()).unwrap()
        }
        GateUp::Fused(w) => GateUp::fused(w.to_device(gpu()).unwrap()).unwrap(),
    }
}

#[test]
fn glu_epilogues_apply_gate_and_up_scales() {
    let dt = DType::Bf16;
    let arch = moekit::cuda::device(0).unwrap().arch();
    for f in formats() {
        for (a, act) in ACTS.into_iter().enumerate() {
            let ffn = scaled_ffn(act, 100 + a as u64);
            let ffn_gpu = ffn.to_device(gpu()).unwrap();
            for t in [1usize, 7, 333] {
                let what = format!("{f} {act:?} T={t}");
                let sort = sort_of(t, K, E, &[3], false, t as u64);
                let x = random(&[t, H], dt, t as u64 + 1);
                let xs = permute_on(Backend::CpuReference, &x, &sort).unwrap();
                let gate = weights(f, E, I, H, 5);
                let ra = tc_ra::supports(dt, &gate, arch);
                let tma = tc_tma::supports(dt, &gate, arch);
                let gu = GateUp::separate(gate, weights(f, E, I, H, 6)).unwrap();
                let cpu_rows = RowExperts::Sorted(&sort.offsets);
                let want = gather_glu_on(Backend::CpuReference, &xs, &gu, cpu_rows, &ffn)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap();
                let unscaled = ExpertFfn {
                    scale: ExpertScales::default(),
                    ..ffn.clone()
                };
                let plain = gather_glu_on(Backend::CpuReference, &xs, &gu, cpu_rows, &unscaled)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap();
                // The scales move the output by far more than the bound the
                // kernels are held to (gpt-oss's clamps and biases damp them
                // to an NMSE of about 1e-2: 100× the bf16 bound).
                let moved = nmse(&plain, &want);
                assert!(
                    moved > 20.0 * bound(dt),
                    "{what}: the scales change little ({moved:e})"
                );
                let gu_gpu = gate_up_on_gpu(&gu);
                let off = sort.offsets.to_device(gpu()).unwrap();
                let sorted = sort.sorted.to_device(gpu()).unwrap();
                let gathered = TcRows::Gathered {
                    offsets: &off,
                    sorted: &sorted,
                    top_k: K,
                };
                let m = t * K;
                let b = bound(dt);
                let check = |name: &str, out: &Tensor| {
                    let e = nmse(&host_f32(out), &want);
                    println!("{name} {what}: NMSE {e:.2e}");
                    assert!(e <= b, "{name} {what}: NMSE {e:e} > {b:e}");
                };
                // The general path (x rows in expert order).
                let out = poisoned(&[m, I], dt);
                let xs_gpu = xs.to_device(gpu()).unwrap();
                gather_glu_into(&xs_gpu, &gu_gpu, RowExperts::Sorted(&off), &ffn_gpu, &out)
                    .unwrap();
                check("gather_glu", &out);
                // The staged tensor-core GEMM (rows gathered through the sort).
                let x_gpu = x.to_device(gpu()).unwrap();
                let out = poisoned(&[m, I], dt);
                tc_glu_into(&x_gpu, &gu_gpu, gathered, &ffn_gpu, &out).unwrap();
                check("tc_gemm", &out);
                // The register-operand GEMM, where it takes the format at
                // this tile (NVFP4 up to 64 rows: T = 333's 83 rows an
                // expert take 128).
                let bm = tc_ra::tile_rows(m, E, I.div_ceil(64), f);
                let ra = ra.and_then(|()| {
                    (bm <= tc_ra::max_tile(f))
                        .then_some(())
                        .ok_or_else(|| format!("{bm}-row tiles"))
                });
                match ra {
                    Ok(()) => {
                        let xp = poisoned(&[t, H], dt);
                        tc_ra::permute_into(&x_gpu, tc_ra::span_order(f), &xp).unwrap();
                        let out = poisoned(&[m, I], dt);
                        tc_ra::glu_into(&xp, &gu_gpu, gathered, &ffn_gpu, &out, None).unwrap();
                        check("tc_ra", &out);
                    }
                    Err(why) => println!("tc_ra {what}: not taken ({why})"),
                }
                // The TMA GEMM (sm_90a), by TMA or through its decoders.
                if tma.is_ok() {
                    let out = poisoned(&[m, I], dt);
                    tc_tma::glu_into(&x_gpu, &gu_gpu, gathered, &ffn_gpu, &out).unwrap();
                    check("tc_tma", &out);
                }
            }
        }
    }
    moekit::cuda::device(0).unwrap().check_errors().unwrap();
}

#[test]
fn combine_weights_fold_down_scales_and_report_bad_ids() {
    for (t, seed) in [(1usize, 1u64), (5, 2), (333, 3)] {
        let mut r = rng(seed);
        let ids: Vec<u32> = (0..t * K).map(|_| r.random_range(0..E as u32)).collect();
        let routing = Routing {
            ids: Tensor::from_slice(&ids, &[t, K]).unwrap(),
            weights: uniform(&[t, K], 0.0, 1.0, seed + 7),
        };
        let scale = uniform(&[E], 0.25, 4.0, seed + 8);
        let want = combine_weights_on(Backend::CpuReference, &routing, &scale)
            .unwrap()
            .to_f32_vec()
            .unwrap();
        let dev = Routing {
            ids: routing.ids.to_device(gpu()).unwrap(),
            weights: routing.weights.to_device(gpu()).unwrap(),
        };
        let got =
            combine_weights_on(Backend::Cuda, &dev, &scale.to_device(gpu()).unwrap()).unwrap();
        // One f32 product each, as on the CPU: bit for bit.
        assert_eq!(host_f32(&got), want, "T={t}");
    }
    // An id ≥ E: its weight is 0 and the device reports it.
    let bad = Routing {
        ids: Tensor::from_slice(&[1u32, E as u32], &[1, 2])
            .unwrap()
            .to_device(gpu())
            .unwrap(),
        weights: Tensor::from_f32(&[0.5, 0.5], &[1, 2], DType::F32)
            .unwrap()
            .to_device(gpu())
            .unwrap(),
    };
    let scale = uniform(&[E], 1.0, 2.0, 9).to_device(gpu()).unwrap();
    let got = combine_weights_on(Backend::Cuda, &bad, &scale).unwrap();
    let err = got.to_device(Device::Cpu).unwrap_err().to_string();
    assert!(err.contains("expert id"), "{err}");
}

/// A block of format `f` with `ffn` (and, with `shared`, an unscaled gated
/// shared expert).
fn block(f: WeightFormat, ffn: ExpertFfn, shared: bool) -> MoeBlock {
    MoeBlock::new(MoeBlockParts {
        router: RouterConfig {
            kind: RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
            n_experts: E,
            top_k: K,
        },
        router_weight: weights(WeightFormat::Dense(DType::F32), 1, E, H, 1),
        gate_up: GateUp::separate(weights(f, E, I, H, 2), weights(f, E, I, H, 3)).unwrap(),
        down: weights(f, E, H, I, 4),
        shared: shared.then(|| SharedExpert {
            gate_up: GateUp::fused(weights(f, 1, 2 * I, H, 5)).unwrap(),
            down: weights(f, 1, H, I, 6),
            gate: Some(weights(WeightFormat::Dense(DType::F32), 1, 1, H, 7)),
        }),
        ffn,
    })
    .unwrap()
}

#[test]
fn scaled_blocks_match_cpu_on_every_cuda_path() {
    for f in formats() {
        for (a, act) in ACTS.into_iter().enumerate() {
            // gpt-oss has no shared expert; the others get one (unscaled).
            let shared = act != GluAct::GPT_OSS;
            let cpu = block(f, scaled_ffn(act, 200 + a as u64), shared);
            let mut parts = cpu.parts().clone();
            parts.ffn.scale = ExpertScales::default();
            let unscaled = MoeBlock::new(parts).unwrap();
            let dev = cpu.to_device(gpu()).unwrap();
            for t in [1usize, 5, 70, 333] {
                for dt in [DType::F32, DType::Bf16] {
                    let what = format!("{f} {act:?} T={t} {dt}");
                    let x = random(&[t, H], dt, t as u64);
                    let reference = |b: &MoeBlock| {
                        with_act_mode(ActMode::F32, || {
                            b.forward_with(Backend::CpuReference, MoePath::General, &x)
                        })
                        .unwrap()
                        .out
                        .to_f32_vec()
                        .unwrap()
                    };
                    let want = reference(&cpu);
                    let e = nmse(&reference(&unscaled), &want);
                    assert!(e > 1e-2, "{what}: the scales change little (NMSE {e:e})");
                    let xg = x.to_device(gpu()).unwrap();
                    let mut paths = vec![MoePath::General];
                    if t <= 64 {
                        paths.push(MoePath::Decode);
                    }
                    if dt == DType::Bf16 {
                        paths.push(MoePath::TensorCore);
                    }
                    for path in paths {
                        let trace = dev.forward_with(Backend::Cuda, path, &xg).unwrap();
                        let e = nmse(&host_f32(&trace.out), &want);
                        println!("{what} {path:?}: NMSE {e:.2e}");
                        // bf16 activations round every intermediate (as the
                        // synthetic block tests): NMSE ≤ 1e-3.
                        let b = if dt == DType::F32 { 1e-9 } else { 1e-3 };
                        assert!(e <= b, "{what} {path:?}: NMSE {e:e} > {b:e}");
                    }
                }
            }
        }
    }
}

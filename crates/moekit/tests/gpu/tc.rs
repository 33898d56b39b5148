//! The tensor-core grouped GEMM (`cuda::ops::tc_gemm`) and the tensor-core
//! MoE block (`cuda::ops::tc_moe`) against the CPU reference.
//!
//! * Every format of `WeightFormat::all()` (affine scales also f32 and bf16)
//!   × f16/bf16 activations × {plain, SwiGLU fused and separate}, rows
//!   gathered through an expert sort, sorted, or a single expert; the dense
//!   f32 hi/lo split. Bounds: `common::bound` (bf16 1e-4, f16 1e-5): weights
//!   are rounded once to the activation type (≤ 2^-9 relative, NMSE ≈ 1e-6).
//! * Every tile row count (16/32/64/128/256, chosen by rows per expert), ragged
//!   N (not a multiple of the 128/64-column tile) and K (not a multiple of
//!   the 64-column step), experts with no rows, all rows on one expert,
//!   E = 512 with k = 10, M = 0.
//! * Outputs are poisoned with NaN, so a missed element fails.
//! * Bad offsets are reported, never read or written out of bounds.
//! * The block: every format vs the CPU, determinism (bit-identical reruns)
//!   and batch invariance (a token alone = the same token in a batch of 300),
//!   graph capture and replay.

use crate::common::*;
use moekit::format::random::random_weights;
use moekit::format::{AffineParams, GgmlType};
use moekit::moe::{MoeBlock, MoeBlockParts, MoePath, SharedExpert};
use moekit::ops::act::{gather_swiglu_on, GateUp};
use moekit::ops::gather_mm::{gather_mm_on, RowExperts};
use moekit::ops::permute::permute_on;
use moekit::ops::route::{RouterConfig, RouterKind};
use moekit::ops::sort::ExpertSort;
use moekit::testing::cuda::tc_gemm::{
    k_parts, matmul_into, split_matmul_into, sum_parts_into, swiglu_into, tile_rows, TcRows,
};
use moekit::{Backend, DType, QuantWeights, Tensor, WeightFormat};

fn weights(f: WeightFormat, e: usize, n: usize, k: usize, scale: DType, seed: u64) -> QuantWeights {
    random_weights(f, e, n, k, scale, seed, &|| {}).unwrap()
}

fn round_k(f: WeightFormat, target: usize) -> usize {
    let g = f.k_granularity().max(8);
    target.div_ceil(g) * g
}

struct Case {
    x: Tensor,
    sort: ExpertSort,
    xs: Tensor, // x permuted to sorted order (CPU)
}

impl Case {
    fn new(dt: DType, r: Spread<'_>, kk: usize, seed: u64) -> Case {
        let x = random(&[r.t, kk], dt, seed);
        let sort = sort_of(r.t, r.k, r.e, r.empty, r.one, seed + 1);
        let xs = permute_on(Backend::CpuReference, &x, &sort).unwrap();
        Case { x, sort, xs }
    }
}

/// A routing to generate: T tokens × k slots over E experts; experts in
/// `empty` get none; with `one`, every slot goes to one expert.
#[derive(Clone, Copy)]
struct Spread<'a> {
    t: usize,
    k: usize,
    e: usize,
    empty: &'a [usize],
    one: bool,
}

fn spread(t: usize, k: usize, e: usize) -> Spread<'static> {
    Spread {
        t,
        k,
        e,
        empty: &[],
        one: false,
    }
}

fn gpu_sort(s: &ExpertSort) -> (Tensor, Tensor) {
    (
        s.offsets.to_device(gpu()).unwrap(),
        s.sorted.to_device(gpu()).unwrap(),
    )
}

/// Plain and SwiGLU GEMMs with gathered rows vs the CPU reference.
fn check(f: WeightFormat, scale: DType, dt: DType, c: &Case, n: usize, seed: u64, what: &str) {
    let e = c.sort.n_experts;
    let kk = c.x.shape()[1];
    let k = c.sort.top_k;
    let m = c.xs.shape()[0];
    let (off, sorted) = gpu_sort(&c.sort);
    let x_gpu = c.x.to_device(gpu()).unwrap();
    let rows = TcRows::Gathered {
        offsets: &off,
        sorted: &sorted,
        top_k: k,
    };
    let cpu_rows = RowExperts::Sorted(&c.sort.offsets);
    let b = bound(dt);
    // Plain.
    let w = weights(f, e, n, kk, scale, seed);
    let w_gpu = w.to_device(gpu()).unwrap();
    let want = gather_mm_on(Backend::CpuReference, &c.xs, &w, cpu_rows).unwrap();
    let out = poisoned(&[m, n], dt);
    matmul_into(&x_gpu, &w_gpu, rows, &out).unwrap();
    let err = nmse(&host_f32(&out), &want.to_f32_vec().unwrap());
    assert!(
        err <= b,
        "tc_gemm {f} {dt} {what} (BM {}): NMSE {err:e} > {b:e}",
        tile_rows(m, e, n.div_ceil(128))
    );
    // SwiGLU, fused and separate layouts.
    let i = n.div_ceil(2).max(8);
    for fused in [true, false] {
        let gu = if fused {
            GateUp::fused(weights(f, e, 2 * i, kk, scale, seed + 2)).unwrap()
        } else {
            GateUp::separate(
                weights(f, e, i, kk, scale, seed + 3),
                weights(f, e, i, kk, scale, seed + 4),
            )
            .unwrap()
        };
        let gu_gpu = match &gu {
            GateUp::Fused(w) => GateUp::fused(w.to_device(gpu()).unwrap()).unwrap(),
            GateUp::Separate { gate, up } => {
                GateUp::separate(gate.to_device(gpu()).unwrap(), up.to_device(gpu()).unwrap())
                    .unwrap()
            }
        };
        let want = gather_swiglu_on(Backend::CpuReference, &c.xs, &gu, cpu_rows).unwrap();
        let out = poisoned(&[m, i], dt);
        swiglu_into(&x_gpu, &gu_gpu, rows, &out).unwrap();
        let err = nmse(&host_f32(&out), &want.to_f32_vec().unwrap());
        assert!(
            err <= b,
            "tc_swiglu {f} {dt} {what} fused={fused}: NMSE {err:e} > {b:e}"
        );
    }
    gpu_device().check_errors().unwrap();
}

fn gpu_device() -> std::sync::Arc<moekit::cuda::CudaDevice> {
    moekit::cuda::device(0).unwrap()
}

#[test]
fn every_format_matches_cpu() {
    for f in WeightFormat::all() {
        let kk = round_k(f, 200); // not a multiple of the 64-column step for 32-blocks
        for dt in [DType::Bf16, DType::F16] {
            let c = Case::new(
                dt,
                Spread {
                    empty: &[0, 7, 15],
                    ..spread(37, 4, 16)
                },
                kk,
                11,
            );
            check(f, DType::F16, dt, &c, 200, 3, "E=16 k=4 T=37");
        }
    }
}

/// FP8 block-scaled weights on the tensor-core GEMM (generic tile
/// decoder): every group size, K not a multiple of the 64-column step.
#[test]
fn fp8_block_formats_match_cpu() {
    for block_k in [32, 64, 128] {
        let f = WeightFormat::Fp8Block { block_k };
        let kk = round_k(f, 200);
        for dt in [DType::Bf16, DType::F16] {
            let c = Case::new(dt, spread(37, 4, 16), kk, 13);
            check(f, DType::F32, dt, &c, 136, 5, "fp8 E=16 k=4 T=37");
        }
    }
}

#[test]
fn affine_scale_dtypes_and_u8() {
    for scale in [DType::F32, DType::Bf16] {
        for bits in [2, 3, 4, 5, 6, 8] {
            for group_size in [32, 64, 128] {
                let f = WeightFormat::Affine(AffineParams { bits, group_size });
                let c = Case::new(DType::Bf16, spread(20, 2, 8), 384, 5);
                check(f, scale, DType::Bf16, &c, 136, 9, "scales");
            }
        }
    }
}

#[test]
fn every_tile_size_and_edge_layouts() {
    let f = WeightFormat::Ggml(GgmlType::Q4_K);
    // E = 8, k = 2: rows per expert 2T/8 → tiles 16, 32, 64, 128, 256.
    for t in [5, 100, 200, 333, 1500] {
        let c = Case::new(
            DType::Bf16,
            Spread {
                empty: &[3],
                ..spread(t, 2, 8)
            },
            512,
            t as u64,
        );
        let m = 2 * t;
        check(
            f,
            DType::F16,
            DType::Bf16,
            &c,
            264,
            1,
            &format!("T={t} BM={}", tile_rows(m, 8, 3)),
        );
    }
    // All rows on one expert; E = 512, k = 10.
    let c = Case::new(
        DType::Bf16,
        Spread {
            one: true,
            ..spread(300, 2, 8)
        },
        256,
        2,
    );
    check(f, DType::F16, DType::Bf16, &c, 128, 2, "one expert");
    let c = Case::new(DType::Bf16, spread(64, 10, 512), 256, 3);
    check(
        WeightFormat::Affine(AffineParams {
            bits: 4,
            group_size: 64,
        }),
        DType::F16,
        DType::Bf16,
        &c,
        72,
        4,
        "E=512 k=10",
    );
    // M = 0.
    let c = Case::new(DType::Bf16, spread(0, 2, 8), 256, 4);
    check(f, DType::F16, DType::Bf16, &c, 64, 5, "M=0");
}

#[test]
fn single_expert_and_f32_split() {
    for dt in [DType::Bf16, DType::F16] {
        let x = random(&[77, 520], dt, 1);
        let xg = x.to_device(gpu()).unwrap();
        for f in [
            WeightFormat::Dense(DType::F32),
            WeightFormat::Dense(dt),
            WeightFormat::Ggml(GgmlType::Q8_0),
        ] {
            let kk = 520usize.div_ceil(f.k_granularity()) * f.k_granularity();
            if kk != 520 {
                continue;
            }
            let w = weights(f, 1, 130, 520, DType::F16, 2);
            let wg = w.to_device(gpu()).unwrap();
            let want = gather_mm_on(Backend::CpuReference, &x, &w, RowExperts::Single)
                .unwrap()
                .to_f32_vec()
                .unwrap();
            let out = poisoned(&[77, 130], dt);
            matmul_into(&xg, &wg, TcRows::Single, &out).unwrap();
            let err = nmse(&host_f32(&out), &want);
            assert!(err <= bound(dt), "single {f} {dt}: {err:e}");
            if f == WeightFormat::Dense(DType::F32) {
                // hi + lo keeps ≈16 bits of each weight: far below one rounding to T.
                let out = poisoned(&[77, 130], dt);
                split_matmul_into(&xg, &wg, TcRows::Single, &out).unwrap();
                let err = nmse(&host_f32(&out), &want);
                assert!(err <= bound(dt), "split {dt}: {err:e}");
            }
        }
    }
}

/// The router's GEMM with K in parts (`TcRows::Parts`, `k_parts` from K
/// alone): dense f32 weights as hi/lo halves and dense weights of T, K of
/// 4, 5 and 1 parts with a short last part (K = 2112: 33 steps in parts of
/// 9) and K not a multiple of the 64-column step. The parts' f32 partial
/// products cover every output (poisoned buffers), their sum in part order
/// rounded once to T is the summing kernel's output bit for bit, the
/// result matches the CPU, and a token's logits are the same bits alone, in
/// 17 tokens, in 300 and in 2100 (16- and 64-row tiles). Parts 0 and 9, and
/// quantized weights, are refused.
#[test]
fn router_k_parts_match_cpu_sum_in_order_and_are_batch_invariant() {
    assert_eq!(
        [2048, 2880, 2112, 72, 4096, 14336].map(k_parts),
        [4, 5, 4, 1, 8, 8]
    );
    for (n, k) in [(128, 2048), (33, 2880), (64, 2112), (8, 72), (20, 520)] {
        let parts = k_parts(k).max(2);
        for dt in [DType::Bf16, DType::F16] {
            let big = random(&[2100, k], dt, 5 + k as u64);
            let x = Tensor::from_f32(&host_f32(&big)[..300 * k], &[300, k], dt).unwrap();
            for f in [WeightFormat::Dense(DType::F32), WeightFormat::Dense(dt)] {
                let w = weights(f, 1, n, k, DType::F16, 7);
                let wg = w.to_device(gpu()).unwrap();
                let want = gather_mm_on(Backend::CpuReference, &x, &w, RowExperts::Single)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap();
                let run = |t: usize| {
                    let xt = Tensor::from_f32(&host_f32(&big)[..t * k], &[t, k], dt)
                        .unwrap()
                        .to_device(gpu())
                        .unwrap();
                    let ws = poisoned(&[parts * t, n], DType::F32);
                    if f == WeightFormat::Dense(DType::F32) {
                        split_matmul_into(&xt, &wg, TcRows::Parts(parts), &ws).unwrap();
                    } else {
                        matmul_into(&xt, &wg, TcRows::Parts(parts), &ws).unwrap();
                    }
                    let out = poisoned(&[t, n], dt);
                    sum_parts_into(&ws, &out).unwrap();
                    (host_f32(&ws), host_f32(&out))
                };
                let (ws, out) = run(300);
                let what = format!("{f} {dt} n {n} k {k} parts {parts}");
                assert!(
                    ws.iter().all(|v| v.is_finite()),
                    "{what}: unwritten partials"
                );
                let sums: Vec<f32> = (0..300 * n)
                    .map(|i| (0..parts).fold(0f32, |s, z| s + ws[z * 300 * n + i]))
                    .collect();
                let rounded = Tensor::from_f32(&sums, &[300, n], dt)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap();
                assert!(
                    rounded
                        .iter()
                        .zip(&out)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: the parts' sum in order"
                );
                let err = nmse(&out, &want);
                assert!(err <= bound(dt), "{what}: {err:e}");
                // 1 and 17 tokens: the 300's 16-row tiles; 2100: 64-row
                // tiles (wgmma, the parts counted in the grid bound).
                for t in [1, 17, 2100] {
                    let (_, o) = run(t);
                    let o = &o[..t.min(300) * n];
                    let same = o.iter().zip(&out).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{what}: T = {t} differs from the same tokens in 300");
                }
            }
        }
    }
    let x = random(&[4, 512], DType::Bf16, 1).to_device(gpu()).unwrap();
    let w = weights(WeightFormat::Dense(DType::Bf16), 1, 16, 512, DType::F16, 2)
        .to_device(gpu())
        .unwrap();
    for z in [0, 9] {
        let ws = poisoned(&[4 * z.max(1), 16], DType::F32);
        let e = matmul_into(&x, &w, TcRows::Parts(z), &ws).unwrap_err();
        assert!(e.to_string().contains("parts"), "{e}");
    }
    let q = weights(
        WeightFormat::Ggml(GgmlType::Q8_0),
        1,
        16,
        512,
        DType::F16,
        3,
    )
    .to_device(gpu())
    .unwrap();
    let ws = poisoned(&[8, 16], DType::F32);
    let e = matmul_into(&x, &q, TcRows::Parts(2), &ws).unwrap_err();
    assert!(e.to_string().contains("dense"), "{e}");
}

/// The tile decoders give the reference's weights rounded once to T, bit
/// for bit: one-hot rows (row r = e_{r mod K}, expert r / K) make the GEMM's
/// output the transposed weights. Two experts of K rows each take 256-row
/// tiles (wgmma on sm_90a); one expert, 16-row tiles (mma.sync). Not for
/// the decoders documented to round q·s + b once in T arithmetic (MLX
/// affine 4-bit, Q4_K: tc_decode.cuh), whose bits may differ in a tie, nor
/// for affine-u8, whose f32 scales make q·s inexact: every GPU path takes
/// fmaf(q, s, b), one rounding, where the CPU reference rounds q·s and then
/// the sum (H100: a few of the 70 000 weights differ by one bf16 ulp).
#[test]
fn tile_decoders_give_the_reference_bits() {
    let mut failed = Vec::new();
    for f in WeightFormat::all() {
        if matches!(f, WeightFormat::Affine(p) if p.bits == 4)
            || matches!(f, WeightFormat::AffineU8 { .. })
            || f == WeightFormat::Ggml(GgmlType::Q4_K)
        {
            continue;
        }
        let n = 136usize;
        let k = round_k(f, 512);
        // f16 for the formats with a fast decoder of their own (their f16
        // arithmetic differs); the others share one f32 path (and f16
        // instances compile on the device: the kernel cache holds bf16).
        let fast = matches!(
            f,
            WeightFormat::Ggml(
                GgmlType::Q8_0
                    | GgmlType::Q4_0
                    | GgmlType::IQ4_NL
                    | GgmlType::IQ4_XS
                    | GgmlType::MXFP4
                    | GgmlType::NVFP4
            )
        );
        let dts: &[DType] = if fast {
            &[DType::Bf16, DType::F16]
        } else {
            &[DType::Bf16]
        };
        for &dt in dts {
            for experts in [1usize, 2] {
                // TcRows::Single takes one expert's weights.
                let w = weights(f, experts, n, k, DType::F16, 41);
                let wg = w.to_device(gpu()).unwrap();
                let dq: Vec<Vec<f32>> = (0..experts)
                    .map(|x| w.dequantize_expert(x).unwrap())
                    .collect();
                let m = experts * k;
                let mut x = vec![0f32; m * k];
                for r in 0..m {
                    x[r * k + r % k] = 1.0;
                }
                let x = Tensor::from_f32(&x, &[m, k], dt)
                    .unwrap()
                    .to_device(gpu())
                    .unwrap();
                let out = poisoned(&[m, n], dt);
                if experts == 1 {
                    matmul_into(&x, &wg, TcRows::Single, &out)
                        .unwrap_or_else(|err| panic!("{f} {dt} single: {err}"));
                } else {
                    let off = Tensor::from_slice(&[0u32, k as u32, 2 * k as u32], &[3])
                        .unwrap()
                        .to_device(gpu())
                        .unwrap();
                    matmul_into(&x, &wg, TcRows::Sorted(&off), &out)
                        .unwrap_or_else(|err| panic!("{f} {dt} sorted: {err}"));
                }
                let got = host_f32(&out);
                let mut want = vec![0f32; m * n];
                for r in 0..m {
                    for nn in 0..n {
                        want[r * n + nn] = dq[r / k][nn * k + r % k];
                    }
                }
                let want = Tensor::from_f32(&want, &[m, n], dt)
                    .unwrap()
                    .to_f32_vec()
                    .unwrap();
                let bad: Vec<_> = (0..m * n)
                    .filter(|&i| got[i] != want[i]) // −0 sums to +0: compare values
                    .take(4)
                    .map(|i| (i / n, i % n, got[i], want[i]))
                    .collect();
                if !bad.is_empty() {
                    failed.push(format!(
                        "{f} {dt} experts={experts} K={k}: weights differ (row, col, got, want) {bad:?}"
                    ));
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    gpu_device().check_errors().unwrap();
}

/// One expert's split GEMM copies halves split beforehand (split.cu); two
/// experts' decodes the f32 weights in the GEMM. Both must give the same
/// bits: expert 0 of the pair holds the single expert's weights (with a −0,
/// a subnormal and values just off T's rounding ties), and 12 rows take
/// 16-row tiles either way.
#[test]
fn split_halves_match_the_decoded_split_bit_for_bit() {
    let (n, k, m) = (130, 520, 12);
    let mut v = weights(WeightFormat::Dense(DType::F32), 1, n, k, DType::F16, 9)
        .data()
        .to_f32_vec()
        .unwrap();
    v[0] = -0.0;
    v[1] = 1e-40;
    v[2] = f32::from_bits(0x3F80_8000); // 1 + 2^-8: a bf16 tie
    v[3] = f32::from_bits(0x3F80_1000); // 1 + 2^-11: an f16 tie
    let single = QuantWeights::new(
        WeightFormat::Dense(DType::F32),
        1,
        n,
        k,
        Tensor::from_slice(&v, &[1, n, k]).unwrap(),
        None,
        None,
    )
    .unwrap()
    .to_device(gpu())
    .unwrap();
    let pair = QuantWeights::new(
        WeightFormat::Dense(DType::F32),
        2,
        n,
        k,
        Tensor::from_slice(
            &v.iter().chain(v.iter()).copied().collect::<Vec<_>>(),
            &[2, n, k],
        )
        .unwrap(),
        None,
        None,
    )
    .unwrap()
    .to_device(gpu())
    .unwrap();
    let offsets = Tensor::from_slice(&[0u32, m as u32, m as u32], &[3])
        .unwrap()
        .to_device(gpu())
        .unwrap();
    for dt in [DType::Bf16, DType::F16] {
        let x = random(&[m, k], dt, 3).to_device(gpu()).unwrap();
        let a = poisoned(&[m, n], dt);
        split_matmul_into(&x, &single, TcRows::Single, &a).unwrap();
        let b = poisoned(&[m, n], dt);
        split_matmul_into(&x, &pair, TcRows::Sorted(&offsets), &b).unwrap();
        let (a, b) = (host_f32(&a), host_f32(&b));
        assert!(a.iter().all(|y| y.is_finite()), "{dt}: unwritten outputs");
        let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{dt}: split halves and decoded split differ");
    }
}

#[test]
fn bad_offsets_are_reported_not_followed() {
    let f = WeightFormat::Ggml(GgmlType::Q8_0);
    let w = weights(f, 4, 64, 128, DType::F16, 1)
        .to_device(gpu())
        .unwrap();
    check_bad_rows(&|x, rows, out| matmul_into(x, &w, rows, out).unwrap());
}

fn block(f: WeightFormat, e: usize, k: usize, h: usize, i: usize, shared: bool) -> MoeBlock {
    let rw = |fmt, n, r, c, seed| weights(fmt, n, r, c, DType::Bf16, seed);
    let router = WeightFormat::Dense(DType::F32);
    MoeBlock::new(MoeBlockParts {
        router: RouterConfig {
            kind: RouterKind::SoftmaxTopK {
                norm_topk_prob: true,
            },
            n_experts: e,
            top_k: k,
        },
        router_weight: rw(router, 1, e, h, 1),
        gate_up: GateUp::fused(rw(f, e, 2 * i, h, 2)).unwrap(),
        down: rw(f, e, h, i, 4),
        shared: shared.then(|| SharedExpert {
            gate_up: GateUp::separate(rw(f, 1, i, h, 5), rw(f, 1, i, h, 6)).unwrap(),
            down: rw(f, 1, h, i, 7),
            gate: Some(rw(router, 1, 1, h, 8)),
        }),
        ffn: Default::default(),
    })
    .unwrap()
}

fn run(b: &MoeBlock, x: &Tensor) -> Vec<f32> {
    host_f32(
        &b.forward_with(
            Backend::Cuda,
            MoePath::TensorCore,
            &x.to_device(gpu()).unwrap(),
        )
        .unwrap()
        .out,
    )
}

#[test]
fn block_matches_cpu_for_every_format() {
    for f in WeightFormat::all() {
        block_matches_cpu(f);
    }
}

/// GGUF NVFP4 (64-weight blocks) alone, for runs that filter on it.
#[test]
fn nvfp4_block_matches_cpu() {
    block_matches_cpu(WeightFormat::Ggml(GgmlType::NVFP4));
}

/// A tensor-core block of format `f` (E = 32, k = 4) against the CPU at
/// T = 1, 40 and 300.
fn block_matches_cpu(f: WeightFormat) {
    let h = round_k(f, 512);
    let i = round_k(f, 256);
    let cpu = block(f, 32, 4, h, i, true);
    let dev = cpu.to_device(gpu()).unwrap();
    for t in [1, 40, 300] {
        let x = random(&[t, h], DType::Bf16, t as u64);
        let want = cpu_forward(&cpu, &x);
        let e = nmse(&run(&dev, &x), &want);
        assert!(e <= 1e-3, "tc block {f} T={t}: NMSE {e:e}");
    }
}

#[test]
fn block_is_deterministic_batch_invariant_and_graph_safe() {
    let f = WeightFormat::Affine(AffineParams {
        bits: 4,
        group_size: 64,
    });
    let b = block(f, 64, 8, 512, 256, true).to_device(gpu()).unwrap();
    let batch = random(&[300, 512], DType::Bf16, 9);
    let full = run(&b, &batch);
    assert_eq!(full, run(&b, &batch), "reruns differ");
    let rows = batch.to_f32_vec().unwrap();
    for t in [0usize, 7, 299] {
        let one = Tensor::from_f32(&rows[t * 512..(t + 1) * 512], &[1, 512], DType::Bf16).unwrap();
        assert_eq!(
            run(&b, &one),
            full[t * 512..(t + 1) * 512].to_vec(),
            "token {t} alone differs"
        );
    }
    // Graph capture and replay.
    let xg = batch.to_device(gpu()).unwrap();
    let dev = gpu_device();
    let _ = b
        .forward_with(Backend::Cuda, MoePath::TensorCore, &xg)
        .unwrap(); // compile first
    let mut out = None;
    let graph = moekit::cuda::graph::capture(&dev, || {
        out = Some(b.forward_with(Backend::Cuda, MoePath::TensorCore, &xg)?.out);
        Ok(())
    })
    .unwrap();
    graph.replay().unwrap();
    dev.synchronize().unwrap();
    assert_eq!(
        host_f32(out.as_ref().unwrap()),
        full,
        "graph replay differs"
    );
    // A fresh block whose first tensor-core call is captured: its router
    // (f32 weights) splits its halves inside the graph instead of keeping
    // them (memory allocated under a capture belongs to the graph); the
    // later plain call keeps them. Both give the same bits.
    let fresh = block(f, 64, 8, 512, 256, true).to_device(gpu()).unwrap();
    let mut first = None;
    let graph = moekit::cuda::graph::capture(&dev, || {
        first = Some(
            fresh
                .forward_with(Backend::Cuda, MoePath::TensorCore, &xg)?
                .out,
        );
        Ok(())
    })
    .unwrap();
    graph.replay().unwrap();
    dev.synchronize().unwrap();
    assert_eq!(
        host_f32(first.as_ref().unwrap()),
        full,
        "a block first called under capture differs"
    );
    assert_eq!(run(&fresh, &batch), full, "kept router halves differ");
    graph.replay().unwrap();
    dev.synchronize().unwrap();
    assert_eq!(
        host_f32(first.as_ref().unwrap()),
        full,
        "the replay after the halves were kept differs"
    );
}

/// A reduced sweep for compute-sanitizer (memcheck, racecheck): the kernel's
/// code paths — raw stages of 32-weight blocks, 256-weight super-blocks,
/// affine scale staging, dense rows; the packed 4-bit, byte and generic
/// tile decoders; plain, SwiGLU and split epilogues; tiles of 16 rows
/// (mma.sync) and 64, 128 and 256 rows (wgmma on sm_90a); ragged N and K — on
/// small shapes.
#[test]
fn sanitizer_sweep() {
    let fmts = [
        WeightFormat::Ggml(GgmlType::Q4_K),
        WeightFormat::Ggml(GgmlType::Q4_0),
        WeightFormat::Affine(AffineParams {
            bits: 4,
            group_size: 64,
        }),
        WeightFormat::Affine(AffineParams {
            bits: 8,
            group_size: 64,
        }),
        WeightFormat::Dense(DType::Bf16),
    ];
    for f in fmts {
        let kk = round_k(f, 320);
        // E = 2, k = 2: tiles of 16, 64, 128 and 256 rows (64: raw copies
        // one step ahead of A on wgmma; 128 with 4-bit codes: not).
        for t in [3, 40, 150, 600] {
            let c = Case::new(DType::Bf16, spread(t, 2, 2), kk, 7);
            check(f, DType::F16, DType::Bf16, &c, 72, 1, "sanitizer");
        }
    }
    let x = random(&[20, 136], DType::Bf16, 1).to_device(gpu()).unwrap();
    let w = weights(WeightFormat::Dense(DType::F32), 1, 70, 136, DType::F16, 2)
        .to_device(gpu())
        .unwrap();
    let out = poisoned(&[20, 70], DType::Bf16);
    split_matmul_into(&x, &w, TcRows::Single, &out).unwrap();
    gpu_device().check_errors().unwrap();
}
